//! Header parsing and formatting for `/files`: content-coding negotiation, byte ranges,
//! conditional requests, HTTP dates and Content-Disposition (both directions).

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::http::{header, HeaderMap, HeaderValue, StatusCode};

/// Response content codings the agent can produce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Coding {
    Identity,
    Gzip,
}

/// Picks the first acceptable coding in q-order (ties keep header order), as envd does.
/// `None` when identity is refused and nothing else offered is supported (→ 406).
pub(super) fn negotiate(headers: &HeaderMap) -> Option<Coding> {
    let mut offers: Vec<(String, f32)> = Vec::new();
    for value in headers.get_all(header::ACCEPT_ENCODING) {
        let Ok(text) = value.to_str() else { continue };
        for item in text.split(',') {
            let mut parts = item.split(';');
            let name = parts.next().unwrap_or("").trim().to_ascii_lowercase();
            if name.is_empty() {
                continue;
            }
            let mut q = 1.0f32;
            for param in parts {
                let param = param.trim();
                if let Some(v) = param
                    .strip_prefix("q=")
                    .or_else(|| param.strip_prefix("Q="))
                {
                    if let Ok(parsed) = v.trim().parse::<f32>() {
                        if parsed.is_finite() {
                            q = parsed.clamp(0.0, 1.0);
                        }
                    }
                }
            }
            offers.push((name, q));
        }
    }
    if offers.is_empty() {
        return Some(Coding::Identity);
    }
    // Identity is acceptable unless refused explicitly, or through `*;q=0` without a mention.
    let identity_q = offers.iter().find(|(n, _)| n == "identity").map(|o| o.1);
    let star_q = offers.iter().find(|(n, _)| n == "*").map(|o| o.1);
    let identity_refused = match identity_q {
        Some(q) => q == 0.0,
        None => star_q == Some(0.0),
    };
    // Stable sort: equal weights keep the client's order.
    offers.sort_by(|a, b| b.1.total_cmp(&a.1));
    for (name, q) in &offers {
        if *q == 0.0 {
            continue;
        }
        match name.as_str() {
            "identity" => return Some(Coding::Identity),
            "gzip" | "x-gzip" => return Some(Coding::Gzip),
            "*" if identity_refused => return Some(Coding::Gzip),
            "*" => return Some(Coding::Identity),
            _ => {}
        }
    }
    (!identity_refused).then_some(Coding::Identity)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RangeOutcome {
    /// No usable range: send everything (RFC 9110 lets servers ignore what they cannot serve).
    Full,
    /// Inclusive byte positions.
    Partial(u64, u64),
    Unsatisfiable,
}

/// Parses a single `bytes=` range against a file of `len > 0` bytes. Multiple ranges and
/// malformed specs are ignored (the whole file is sent).
pub(super) fn parse_range(spec: &str, len: u64) -> RangeOutcome {
    if len == 0 {
        return RangeOutcome::Full;
    }
    let spec = spec.trim();
    let Some(set) = spec
        .get(..6)
        .filter(|p| p.eq_ignore_ascii_case("bytes="))
        .and_then(|_| spec.get(6..))
    else {
        return RangeOutcome::Full;
    };
    if set.contains(',') {
        return RangeOutcome::Full;
    }
    let Some((first, last)) = set.trim().split_once('-') else {
        return RangeOutcome::Full;
    };
    let (first, last) = (first.trim(), last.trim());
    if first.is_empty() {
        // Suffix range: the last N bytes.
        return match last.parse::<u64>() {
            Ok(0) => RangeOutcome::Unsatisfiable,
            Ok(n) => RangeOutcome::Partial(len.saturating_sub(n), len - 1),
            Err(_) => RangeOutcome::Full,
        };
    }
    let Ok(start) = first.parse::<u64>() else {
        return RangeOutcome::Full;
    };
    let end = if last.is_empty() {
        len - 1
    } else {
        match last.parse::<u64>() {
            Ok(end) if end >= start => end.min(len - 1),
            _ => return RangeOutcome::Full,
        }
    };
    if start >= len {
        return RangeOutcome::Unsatisfiable;
    }
    RangeOutcome::Partial(start, end)
}

/// `If-Range` with a date: the range applies only if the file is unchanged since. We issue no
/// entity tags, so an `If-Range` with a tag never matches.
pub(super) fn if_range_holds(headers: &HeaderMap, mtime: Option<u64>) -> bool {
    match headers.get(header::IF_RANGE) {
        None => true,
        Some(v) => match (v.to_str().ok().and_then(parse_http_date), mtime) {
            (Some(date), Some(m)) => date == m,
            _ => false,
        },
    }
}

/// `If-Unmodified-Since` (→ 412) and `If-Modified-Since` (→ 304), compared in whole seconds.
pub(super) fn precondition(headers: &HeaderMap, mtime: Option<u64>) -> Option<StatusCode> {
    let mtime = mtime?;
    let date = |name: header::HeaderName| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .and_then(parse_http_date)
    };
    if date(header::IF_UNMODIFIED_SINCE).is_some_and(|d| mtime > d) {
        return Some(StatusCode::PRECONDITION_FAILED);
    }
    // If-None-Match takes precedence over If-Modified-Since; having no tags, we skip both.
    if !headers.contains_key(header::IF_NONE_MATCH)
        && date(header::IF_MODIFIED_SINCE).is_some_and(|d| mtime <= d)
    {
        return Some(StatusCode::NOT_MODIFIED);
    }
    None
}

pub(super) fn unix_secs(t: SystemTime) -> Option<u64> {
    t.duration_since(UNIX_EPOCH).ok().map(|d| d.as_secs())
}

pub(super) fn http_date(secs: u64) -> String {
    let secs = i64::try_from(secs).unwrap_or(0);
    chrono::DateTime::from_timestamp(secs, 0)
        .unwrap_or_default()
        .format("%a, %d %b %Y %H:%M:%S GMT")
        .to_string()
}

pub(super) fn parse_http_date(text: &str) -> Option<u64> {
    let t = chrono::DateTime::parse_from_rfc2822(text.trim()).ok()?;
    u64::try_from(t.timestamp()).ok()
}

/// `inline; filename="<base>"`, quoted and escaped; names that are not plain ASCII get an
/// ASCII stand-in plus the exact name as RFC 8187 `filename*`.
pub(super) fn content_disposition(path: &Path) -> HeaderValue {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut quoted = String::with_capacity(name.len() + 2);
    let mut plain = true;
    for c in name.chars() {
        match c {
            '"' | '\\' => {
                quoted.push('\\');
                quoted.push(c);
            }
            ' '..='~' => quoted.push(c),
            _ => {
                plain = false;
                quoted.push('_');
            }
        }
    }
    let mut value = format!("inline; filename=\"{quoted}\"");
    if !plain {
        value.push_str("; filename*=UTF-8''");
        for b in name.bytes() {
            if b.is_ascii_alphanumeric() || b"!#$&+-.^_`|~".contains(&b) {
                value.push(char::from(b));
            } else {
                value.push_str(&format!("%{b:02X}"));
            }
        }
    }
    HeaderValue::from_str(&value).unwrap_or_else(|_| HeaderValue::from_static("inline"))
}

/// The `filename` of a part's Content-Disposition, unmodified: the SDKs put the whole target
/// path there. Handles RFC 2231/8187 `filename*=` (preferred), quoted strings with backslash
/// escapes, and bare tokens, like Go's `mime.ParseMediaType` that envd relies on.
pub(super) fn part_file_name(headers: &HeaderMap) -> Option<String> {
    let value = headers.get(header::CONTENT_DISPOSITION)?.as_bytes();
    let value = String::from_utf8_lossy(value);
    let mut plain = None;
    let mut extended = None;
    let mut rest = value.as_ref();
    // Skip the disposition type.
    rest = rest.split_once(';').map(|(_, r)| r).unwrap_or("");
    loop {
        rest = rest.trim_start_matches([' ', '\t', ';']);
        if rest.is_empty() {
            break;
        }
        let Some((name, after)) = rest.split_once('=') else {
            break;
        };
        let name = name.trim().to_ascii_lowercase();
        let after = after.trim_start();
        let (val, remaining) = if let Some(quoted) = after.strip_prefix('"') {
            let mut out = String::new();
            let mut chars = quoted.char_indices();
            let mut end = quoted.len();
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => {
                        if let Some((_, n)) = chars.next() {
                            out.push(n);
                        }
                    }
                    '"' => {
                        end = i + 1;
                        break;
                    }
                    c => out.push(c),
                }
            }
            (out, &quoted[end.min(quoted.len())..])
        } else {
            let end = after.find(';').unwrap_or(after.len());
            (after[..end].trim().to_string(), &after[end..])
        };
        match name.as_str() {
            "filename" => plain = Some(val),
            "filename*" => extended = decode_ext_value(&val),
            _ => {}
        }
        rest = remaining;
    }
    extended.or(plain)
}

/// Decodes an RFC 8187 ext-value `charset'lang'pct-encoded` (UTF-8 or ASCII only).
fn decode_ext_value(v: &str) -> Option<String> {
    let mut parts = v.splitn(3, '\'');
    let charset = parts.next()?.to_ascii_lowercase();
    let _lang = parts.next()?;
    let encoded = parts.next()?;
    if charset != "utf-8" && charset != "us-ascii" {
        return None;
    }
    let bytes = encoded.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accept(v: &str) -> Option<Coding> {
        let mut h = HeaderMap::new();
        h.insert(
            header::ACCEPT_ENCODING,
            HeaderValue::from_str(v).expect("valid header"),
        );
        negotiate(&h)
    }

    #[test]
    fn negotiates_like_envd() {
        assert_eq!(negotiate(&HeaderMap::new()), Some(Coding::Identity));
        assert_eq!(accept("gzip, deflate"), Some(Coding::Gzip));
        assert_eq!(accept("gzip, deflate, br, zstd"), Some(Coding::Gzip));
        assert_eq!(accept("identity"), Some(Coding::Identity));
        assert_eq!(accept("br;q=1.0, gzip;q=0.8"), Some(Coding::Gzip));
        assert_eq!(accept("identity, gzip"), Some(Coding::Identity));
        assert_eq!(accept("identity;q=0.5, gzip"), Some(Coding::Gzip));
        assert_eq!(accept("gzip;q=0"), Some(Coding::Identity));
        assert_eq!(accept("br"), Some(Coding::Identity));
        assert_eq!(accept("*"), Some(Coding::Identity));
        assert_eq!(accept("identity;q=0, *"), Some(Coding::Gzip));
        assert_eq!(accept("identity;q=0, gzip"), Some(Coding::Gzip));
        assert_eq!(accept("identity;q=0"), None);
        assert_eq!(accept("br, identity;q=0"), None);
        assert_eq!(accept("*;q=0"), None);
        assert_eq!(accept("*;q=0, identity"), Some(Coding::Identity));
    }

    #[test]
    fn parses_ranges() {
        use RangeOutcome::*;
        assert_eq!(parse_range("bytes=0-9", 100), Partial(0, 9));
        assert_eq!(parse_range("bytes=90-", 100), Partial(90, 99));
        assert_eq!(parse_range("bytes=90-500", 100), Partial(90, 99));
        assert_eq!(parse_range("bytes=-10", 100), Partial(90, 99));
        assert_eq!(parse_range("bytes=-500", 100), Partial(0, 99));
        assert_eq!(parse_range("bytes=100-", 100), Unsatisfiable);
        assert_eq!(parse_range("bytes=-0", 100), Unsatisfiable);
        assert_eq!(parse_range("bytes=5-2", 100), Full);
        assert_eq!(parse_range("bytes=0-1,5-6", 100), Full);
        assert_eq!(parse_range("items=0-1", 100), Full);
        assert_eq!(parse_range("bytes=x-1", 100), Full);
        assert_eq!(parse_range("bytes", 100), Full);
        assert_eq!(parse_range("bytes=é", 100), Full);
    }

    #[test]
    fn disposition_is_quoted() {
        let v = content_disposition(Path::new("/tmp/a \"b\".txt"));
        assert_eq!(v, "inline; filename=\"a \\\"b\\\".txt\"");
        let v = content_disposition(Path::new("/tmp/ü.txt"));
        assert_eq!(v, "inline; filename=\"_.txt\"; filename*=UTF-8''%C3%BC.txt");
    }

    #[test]
    fn part_file_names_keep_paths() {
        let name = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(
                header::CONTENT_DISPOSITION,
                HeaderValue::from_str(v).expect("valid header"),
            );
            part_file_name(&h)
        };
        assert_eq!(
            name("form-data; name=\"file\"; filename=\"/tmp/a/b.txt\"").as_deref(),
            Some("/tmp/a/b.txt")
        );
        assert_eq!(
            name("form-data; name=file; filename=dir/x.txt").as_deref(),
            Some("dir/x.txt")
        );
        assert_eq!(
            name(r#"form-data; filename="a\"b;c.txt"; name="file""#).as_deref(),
            Some("a\"b;c.txt")
        );
        assert_eq!(
            name("form-data; name=\"file\"; filename=\"x\"; filename*=UTF-8''%C3%BC.txt")
                .as_deref(),
            Some("ü.txt")
        );
        assert_eq!(name("form-data; name=\"file\""), None);
    }

    #[test]
    fn http_dates_roundtrip() {
        assert_eq!(http_date(784111777), "Sun, 06 Nov 1994 08:49:37 GMT");
        assert_eq!(
            parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT"),
            Some(784111777)
        );
        assert_eq!(parse_http_date("yesterday"), None);
    }
}
