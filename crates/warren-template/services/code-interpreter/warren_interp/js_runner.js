'use strict'
// The JavaScript side of the warren-javascript and warren-typescript kernels (runner_kernel.py): one long-lived Node.js
// process whose global scope is the context's state.
//
// Requests arrive on stdin, one JSON line each: {"code": "..."}. Code runs in this process's
// own global context (vm.runInThisContext), so top-level `var`, `let`, `const` and functions
// persist between executions, and `require` works as in a CommonJS module. The code's own
// output goes to stdout/stderr as usual (the kernel streams them); the outcome goes to the
// file descriptor named by WARREN_RUNNER_FD as JSON lines: result, error, then done.
//
// TypeScript (WARREN_JS_TYPESCRIPT=1, the warren-typescript kernel): each cell is first
// transpiled with Debian's TypeScript compiler (types removed, no type checking, as
// ts-node's transpile-only mode), then runs exactly as JavaScript does.
//
// Interrupts: the kernel's process group gets SIGINT. `breakOnSigint` turns it into an
// exception while synchronous code runs; outside of that the no-op handler keeps the process
// (and the state) alive.

const vm = require('vm')
const util = require('util')
const fs = require('fs')
const readline = require('readline')

const out = Number(process.env.WARREN_RUNNER_FD)
delete process.env.WARREN_RUNNER_FD
const typescript = process.env.WARREN_JS_TYPESCRIPT === '1' ? require('/usr/share/nodejs/typescript') : null
delete process.env.WARREN_JS_TYPESCRIPT

function send(message) {
  fs.writeSync(out, JSON.stringify(message) + '\n')
}

globalThis.require = require
globalThis.module = module
globalThis.exports = module.exports
process.on('SIGINT', () => {})

const options = { filename: 'cell.js', breakOnSigint: true }

// Scripts cannot hold ES module `import` statements; the common forms, each on a line of its
// own, become the equivalent require() (so they work for CommonJS and built-in modules).
function namedImports(list) {
  return list.split(',').map((s) => s.trim()).filter(Boolean)
    .map((s) => s.replace(/^([\w$]+)\s+as\s+([\w$]+)$/, '$1: $2')).join(', ')
}

function rewriteImports(code) {
  const statement = /^[ \t]*import\s+(.+?)\s+from\s+(['"][^'"\n]+['"])[ \t]*;?[ \t]*$/gm
  return code
    .replace(statement, (line, clause, source) => {
      const req = `require(${source})`
      let m
      clause = clause.trim()
      if ((m = clause.match(/^\*\s+as\s+([\w$]+)$/))) return `var ${m[1]} = ${req};`
      if ((m = clause.match(/^\{([^}]*)\}$/))) return `var { ${namedImports(m[1])} } = ${req};`
      if ((m = clause.match(/^([\w$]+)\s*,\s*\{([^}]*)\}$/))) {
        return `var ${m[1]} = ${req}; var { ${namedImports(m[2])} } = ${req};`
      }
      if ((m = clause.match(/^([\w$]+)$/))) return `var ${m[1]} = ${req};`
      return line
    })
    .replace(/^[ \t]*import\s+(['"][^'"\n]+['"])[ \t]*;?[ \t]*$/gm, 'require($1);')
}

// TypeScript to JavaScript of the same shape: ES modules' `import` lines stay (rewritten
// below) and top-level `await` stays. Syntax errors are reported as JavaScript's would be.
function transpile(code) {
  const { outputText, diagnostics } = typescript.transpileModule(code, {
    compilerOptions: {
      target: typescript.ScriptTarget.ES2022,
      // Imports stay as written (those used only as types vanish).
      module: typescript.ModuleKind.ESNext,
    },
    reportDiagnostics: true,
    fileName: 'cell.ts',
  })
  const errors = (diagnostics || []).filter((d) => d.category === typescript.DiagnosticCategory.Error)
  if (errors.length) {
    throw new SyntaxError(typescript.flattenDiagnosticMessageText(errors[0].messageText, '\n'))
  }
  return outputText
}

// Scripts cannot use `await` at the top level. Such code runs as the body of an async
// function instead: first as one expression (so `await f()` gives its value), else as
// statements (its declarations then stay local to that execution).
function evaluate(code) {
  if (typescript) code = transpile(code)
  code = rewriteImports(code)
  try {
    return vm.runInThisContext(code, options)
  } catch (err) {
    if (!(err instanceof SyntaxError) || !/\bawait\b/.test(code)) throw err
  }
  try {
    // As one expression: without the statement's closing semicolon (TypeScript adds one).
    const expression = code.replace(/;\s*$/, '')
    return vm.runInThisContext(`(async () => (${expression}\n))()`, options)
  } catch (err) {
    if (!(err instanceof SyntaxError)) throw err
  }
  return vm.runInThisContext(`(async () => {${code}\n})()`, options)
}

async function run(code) {
  try {
    let value = evaluate(code)
    if (value !== null && typeof value === 'object' && typeof value.then === 'function') {
      value = await value
    }
    if (value !== undefined) {
      send({ type: 'result', text: util.inspect(value, { depth: 6, maxArrayLength: 200 }) })
    }
  } catch (err) {
    const isError = err instanceof Error
    send({
      type: 'error',
      name: isError ? err.name : 'Error',
      value: isError ? err.message : util.inspect(err),
      traceback: isError && err.stack ? err.stack : String(err),
    })
  }
  send({ type: 'done' })
}

// One request at a time: the kernel sends the next only after `done`.
const lines = readline.createInterface({ input: process.stdin })
lines.on('line', (line) => {
  let request
  try {
    request = JSON.parse(line)
  } catch (err) {
    send({ type: 'error', name: 'ProtocolError', value: String(err), traceback: '' })
    send({ type: 'done' })
    return
  }
  run(String(request.code ?? ''))
})
lines.on('close', () => process.exit(0))
