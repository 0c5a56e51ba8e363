//! Docker's word rules: splitting arguments on unquoted whitespace, then removing quotes and
//! escapes and substituting `$VAR`, `${VAR}` and `${VAR<op>word}` (`:-`, `-`, `:+`, `+`, `:?`,
//! `?`) as Docker's shell lexer does for ENV, ARG, WORKDIR, USER, COPY and FROM.

use std::collections::HashMap;

/// The variables `$VAR` can name at some point of a Dockerfile.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Env(HashMap<String, String>);

impl Env {
    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }

    pub(crate) fn set(&mut self, name: &str, value: &str) {
        self.0.insert(name.to_string(), value.to_string());
    }
}

/// How unknown variables are treated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Subst {
    /// Every reference is replaced; an unknown variable is empty (Docker's reading).
    All,
    /// Known variables are replaced; a reference to an unknown one is kept as written, for the
    /// builder's shell to expand against the image's environment (ENV values, as the SDK
    /// leaves them). A literal `$` cannot then be told from a reference, so it is refused.
    KnownOnly,
}

/// Names Docker accepts for ARG and ENV.
pub(crate) fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c == '_' || c.is_ascii_alphabetic())
        && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
}

/// Splits on whitespace outside quotes; each word keeps its quotes and escapes.
pub(crate) fn split_words(text: &str, escape: char) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match quote {
            Some(q) => {
                cur.push(c);
                if c == escape && q == '"' {
                    if let Some(n) = chars.next() {
                        cur.push(n);
                    }
                } else if c == q {
                    quote = None;
                }
            }
            None if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            None => {
                in_word = true;
                cur.push(c);
                if c == escape {
                    if let Some(n) = chars.next() {
                        cur.push(n);
                    }
                } else if c == '\'' || c == '"' {
                    quote = Some(c);
                }
            }
        }
    }
    if let Some(q) = quote {
        return Err(format!("unterminated {q} quote"));
    }
    if in_word {
        words.push(cur);
    }
    Ok(words)
}

const DOLLAR_REFUSED: &str = "a literal '$' in an ENV value is not supported (the builder \
                              expands $ references against the build environment)";

/// One word with its quotes and escapes removed and its variables substituted.
pub(crate) fn process(word: &str, escape: char, env: &Env, mode: Subst) -> Result<String, String> {
    let chars: Vec<char> = word.chars().collect();
    let mut out = String::new();
    let mut i = 0;
    let mut quote: Option<char> = None;
    let literal_dollar = |c: char| -> Result<(), String> {
        if c == '$' && mode == Subst::KnownOnly {
            Err(DOLLAR_REFUSED.into())
        } else {
            Ok(())
        }
    };
    while i < chars.len() {
        let c = chars[i];
        match quote {
            Some('\'') => {
                if c == '\'' {
                    quote = None;
                } else {
                    literal_dollar(c)?;
                    out.push(c);
                }
                i += 1;
            }
            Some(_) if c == '"' => {
                quote = None;
                i += 1;
            }
            _ if c == escape => {
                match chars.get(i + 1) {
                    // In double quotes only `"`, `$` and the escape itself are escaped.
                    Some(&n) if quote.is_none() || n == '"' || n == '$' || n == escape => {
                        literal_dollar(n)?;
                        out.push(n);
                        i += 2;
                    }
                    _ => {
                        out.push(c);
                        i += 1;
                    }
                }
            }
            None if c == '\'' || c == '"' => {
                quote = Some(c);
                i += 1;
            }
            _ if c == '$' => {
                i = dollar(&chars, i, escape, env, mode, &mut out)?;
            }
            _ => {
                out.push(c);
                i += 1;
            }
        }
    }
    if quote.is_some() {
        return Err("unterminated quote".into());
    }
    Ok(out)
}

/// Substitutes the reference at `chars[at]` (a `$`) into `out`; returns the index after it.
fn dollar(
    chars: &[char],
    at: usize,
    escape: char,
    env: &Env,
    mode: Subst,
    out: &mut String,
) -> Result<usize, String> {
    let name_char = |c: char| c == '_' || c.is_ascii_alphanumeric();
    match chars.get(at + 1) {
        Some('{') => {
            // The matching brace, counting nested `${…}` in the word.
            let mut depth = 0;
            let mut end = None;
            for (j, &c) in chars.iter().enumerate().skip(at + 1) {
                match c {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            end = Some(j);
                            break;
                        }
                    }
                    _ => {}
                }
            }
            let end = end.ok_or("missing '}' in a ${...} reference")?;
            let inner: String = chars[at + 2..end].iter().collect();
            let name_len = inner.chars().take_while(|&c| name_char(c)).count();
            let (name, op_word) = inner.split_at(name_len);
            if name.is_empty() || !valid_name(name) {
                return Err(format!("bad substitution ${{{inner}}}"));
            }
            let value = env.get(name);
            if value.is_none() && mode == Subst::KnownOnly {
                out.extend(&chars[at..=end]);
                return Ok(end + 1);
            }
            let (op, word) = [":-", ":+", ":?", "-", "+", "?"]
                .iter()
                .find_map(|op| op_word.strip_prefix(op).map(|w| (*op, w)))
                .unwrap_or(("", op_word));
            if op.is_empty() && !word.is_empty() {
                return Err(format!(
                    "unsupported substitution ${{{inner}}} (supported: $V, ${{V}}, ${{V:-w}}, ${{V:+w}}, ${{V:?w}})"
                ));
            }
            let set = value.is_some();
            let non_empty = value.is_some_and(|v| !v.is_empty());
            let word = || process(word, escape, env, mode);
            let result = match op {
                "" => value.unwrap_or("").to_string(),
                ":-" if non_empty => value.unwrap_or("").to_string(),
                "-" if set => value.unwrap_or("").to_string(),
                ":-" | "-" => word()?,
                ":+" if non_empty => word()?,
                "+" if set => word()?,
                ":+" | "+" => String::new(),
                ":?" if !non_empty => return Err(format!("{name}: {}", word()?)),
                "?" if !set => return Err(format!("{name}: {}", word()?)),
                _ => value.unwrap_or("").to_string(),
            };
            if mode == Subst::KnownOnly && result.contains('$') {
                return Err(DOLLAR_REFUSED.into());
            }
            out.push_str(&result);
            Ok(end + 1)
        }
        Some(&c) if c == '_' || c.is_ascii_alphabetic() => {
            let len = chars[at + 1..]
                .iter()
                .take_while(|&&c| name_char(c))
                .count();
            let name: String = chars[at + 1..at + 1 + len].iter().collect();
            match env.get(&name) {
                Some(v) => {
                    if mode == Subst::KnownOnly && v.contains('$') {
                        return Err(DOLLAR_REFUSED.into());
                    }
                    out.push_str(v);
                }
                None if mode == Subst::KnownOnly => {
                    out.push('$');
                    out.push_str(&name);
                }
                None => {}
            }
            Ok(at + 1 + len)
        }
        // A `$` that starts no reference is itself.
        _ => {
            if mode == Subst::KnownOnly {
                return Err(DOLLAR_REFUSED.into());
            }
            out.push('$');
            Ok(at + 1)
        }
    }
}
