//! JSON answers of the hot reads (top-N, predictions) written straight into one buffer:
//! the bytes `serde_json` writes for the documented structs, without a serializer call
//! per field name (the tests of the handlers compare the two).

use actix_web::http::header::ContentType;
use actix_web::HttpResponse;
use serde::Serialize;

/// An answer being written.
pub struct JsonOut(Vec<u8>);

impl JsonOut {
    /// Room for a page of a list: the buffer does not grow on a typical answer.
    pub fn new() -> Self {
        Self(Vec::with_capacity(1024))
    }

    /// JSON text written as is (punctuation and field names).
    pub fn raw(&mut self, s: &str) -> &mut Self {
        self.0.extend_from_slice(s.as_bytes());
        self
    }

    /// A JSON string, escaped as `serde_json` escapes it; ids without a character to
    /// escape (the usual case) are copied.
    pub fn str(&mut self, s: &str) -> &mut Self {
        if s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
            self.0.push(b'"');
            self.0.extend_from_slice(s.as_bytes());
            self.0.push(b'"');
            self
        } else {
            self.value(s)
        }
    }

    /// Any value through `serde_json` (numbers: its formatting, `null` for non-finite).
    pub fn value<T: Serialize + ?Sized>(&mut self, v: &T) -> &mut Self {
        // Writing into a Vec fails only for a value whose Serialize fails, which none of
        // the answers' values do (no maps with non-string keys).
        serde_json::to_writer(&mut self.0, v).expect("a JSON value of an answer");
        self
    }

    /// An answer about one user under one release: `{"user":...,"model_version":...,
    /// "guarantee":...` (the first fields of the top-N and prediction answers).
    pub fn user_answer(user: &str, model_version: i64, guarantee: &impl Serialize) -> Self {
        let mut o = Self::new();
        o.raw("{\"user\":")
            .str(user)
            .raw(",\"model_version\":")
            .value(&model_version)
            .raw(",\"guarantee\":")
            .value(guarantee);
        o
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.0
    }

    /// A 200 with this JSON (what `HttpResponse::json` sends).
    pub fn ok(self) -> HttpResponse {
        HttpResponse::Ok()
            .content_type(ContentType::json())
            .body(self.0)
    }
}

impl Default for JsonOut {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Strings are escaped byte for byte as `serde_json` does.
    #[test]
    fn strings_are_serde_json_strings() {
        let mut all: Vec<String> = ["", "i1", "a\"b", "back\\slash", "tab\t", "é€😀", "\u{7f}"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        all.extend((0u8..0x80).map(|b| format!("x{}y", b as char)));
        for s in &all {
            let mut out = JsonOut::new();
            out.str(s);
            assert_eq!(
                String::from_utf8(out.into_bytes()).unwrap(),
                serde_json::to_string(s).unwrap(),
                "{s:?}"
            );
        }
    }
}
