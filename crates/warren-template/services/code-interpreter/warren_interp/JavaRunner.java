// The Java side of the warren-java kernel (runner_kernel.py, code-interpreter-full): one
// long-lived JVM whose JShell keeps the context's state (variables, methods, classes, imports).
//
// Requests arrive on stdin: the code's length in bytes, a newline, the code. A cell may hold
// several snippets; JShell's own source analysis splits it, and they run in order until one
// fails. Code runs in this JVM (JShell's "local" execution engine), so what it prints goes
// straight to this process's stdout and stderr, which the kernel streams. The outcome goes to
// the file descriptor named by WARREN_RUNNER_FD as JSON lines: result, error, then done.
//
// Interrupts: the kernel's process group gets SIGINT, which stops the running snippet instead
// of ending the JVM.

import java.io.BufferedInputStream;
import java.io.ByteArrayOutputStream;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.PrintStream;
import java.io.PrintWriter;
import java.io.StringWriter;
import java.nio.charset.StandardCharsets;
import java.util.Locale;
import java.util.stream.Collectors;

import jdk.jshell.EvalException;
import jdk.jshell.JShell;
import jdk.jshell.Snippet;
import jdk.jshell.SnippetEvent;
import jdk.jshell.SourceCodeAnalysis;
import jdk.jshell.VarSnippet;

public class JavaRunner {
    private static PrintStream control;

    public static void main(String[] args) throws IOException {
        String fd = System.getenv("WARREN_RUNNER_FD");
        control = new PrintStream(new FileOutputStream("/proc/self/fd/" + fd), true, StandardCharsets.UTF_8);
        // Requests come on stdin; the code itself reads an empty stream.
        InputStream requests = new BufferedInputStream(System.in);
        System.setIn(InputStream.nullInputStream());
        JShell shell = JShell.builder()
                .executionEngine("local")
                .out(System.out)
                .err(System.err)
                .in(InputStream.nullInputStream())
                .build();
        sun.misc.Signal.handle(new sun.misc.Signal("INT"), signal -> shell.stop());
        while (true) {
            String header = readLine(requests);
            if (header == null) {
                System.exit(0);
            }
            int length = Integer.parseInt(header.trim());
            String code = new String(requests.readNBytes(length), StandardCharsets.UTF_8);
            run(shell, code);
        }
    }

    private static String readLine(InputStream in) throws IOException {
        ByteArrayOutputStream line = new ByteArrayOutputStream();
        int b;
        while ((b = in.read()) != -1) {
            if (b == '\n') {
                return line.toString(StandardCharsets.UTF_8);
            }
            line.write(b);
        }
        return null;
    }

    private static void run(JShell shell, String code) {
        SourceCodeAnalysis analysis = shell.sourceCodeAnalysis();
        String remaining = code;
        String value = null;
        boolean failed = false;
        while (!failed && !remaining.isBlank()) {
            SourceCodeAnalysis.CompletionInfo info = analysis.analyzeCompletion(remaining);
            if (info.completeness() == SourceCodeAnalysis.Completeness.EMPTY) {
                break;
            }
            String source;
            if (info.completeness().isComplete()) {
                source = info.source();
                remaining = info.remaining();
            } else {
                // Incomplete or unknown: evaluated as is, so JShell says what is wrong.
                source = remaining;
                remaining = "";
            }
            value = null;
            for (SnippetEvent event : shell.eval(source)) {
                if (event.causeSnippet() != null) {
                    continue; // a snippet that depends on this one was updated
                }
                Snippet snippet = event.snippet();
                if (event.status() == Snippet.Status.REJECTED) {
                    String message = shell.diagnostics(snippet)
                            .map(d -> d.getMessage(Locale.ROOT))
                            .collect(Collectors.joining("\n"));
                    error("CompilationException", message, source);
                    failed = true;
                    break;
                }
                if (event.exception() != null) {
                    Throwable thrown = event.exception();
                    String name = thrown instanceof EvalException
                            ? ((EvalException) thrown).getExceptionClassName()
                            : thrown.getClass().getName();
                    StringWriter trace = new StringWriter();
                    thrown.printStackTrace(new PrintWriter(trace));
                    error(name, String.valueOf(thrown.getMessage()), trace.toString());
                    failed = true;
                    break;
                }
                if (event.value() != null && isExpression(snippet)) {
                    value = display(snippet, event.value());
                }
            }
        }
        System.out.flush();
        System.err.flush();
        if (!failed && value != null) {
            send("{\"type\":\"result\",\"text\":" + quote(value) + "}");
        }
        send("{\"type\":\"done\"}");
    }

    /** Whether the snippet is an expression whose value a notebook shows. */
    private static boolean isExpression(Snippet snippet) {
        return snippet.kind() == Snippet.Kind.EXPRESSION
                || snippet.subKind() == Snippet.SubKind.TEMP_VAR_EXPRESSION_SUBKIND;
    }

    /** JShell's value text, with a String shown as its contents (as IJava shows it). */
    private static String display(Snippet snippet, String value) {
        String type = snippet instanceof VarSnippet ? ((VarSnippet) snippet).typeName()
                : snippet instanceof jdk.jshell.ExpressionSnippet
                        ? ((jdk.jshell.ExpressionSnippet) snippet).typeName() : "";
        if (type.equals("String") && value.length() >= 2 && value.startsWith("\"") && value.endsWith("\"")) {
            return unescape(value.substring(1, value.length() - 1));
        }
        return value;
    }

    private static String unescape(String s) {
        StringBuilder out = new StringBuilder(s.length());
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            if (c != '\\' || i + 1 == s.length()) {
                out.append(c);
                continue;
            }
            char next = s.charAt(++i);
            switch (next) {
                case 'n': out.append('\n'); break;
                case 't': out.append('\t'); break;
                case 'r': out.append('\r'); break;
                case 'b': out.append('\b'); break;
                case 'f': out.append('\f'); break;
                case '0': out.append('\0'); break;
                case 'u':
                    if (i + 4 < s.length()) {
                        out.append((char) Integer.parseInt(s.substring(i + 1, i + 5), 16));
                        i += 4;
                    }
                    break;
                default: out.append(next);
            }
        }
        return out.toString();
    }

    private static void error(String name, String value, String traceback) {
        send("{\"type\":\"error\",\"name\":" + quote(name) + ",\"value\":" + quote(value)
                + ",\"traceback\":" + quote(traceback) + "}");
    }

    private static void send(String line) {
        control.print(line + "\n");
        control.flush();
    }

    /** A JSON string literal. */
    private static String quote(String s) {
        StringBuilder out = new StringBuilder(s.length() + 2).append('"');
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            switch (c) {
                case '"': out.append("\\\""); break;
                case '\\': out.append("\\\\"); break;
                case '\n': out.append("\\n"); break;
                case '\r': out.append("\\r"); break;
                case '\t': out.append("\\t"); break;
                default:
                    if (c < 0x20) {
                        out.append(String.format("\\u%04x", (int) c));
                    } else {
                        out.append(c);
                    }
            }
        }
        return out.append('"').toString();
    }
}
