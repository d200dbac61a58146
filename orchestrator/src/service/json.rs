//! JSON bodies parsed with the API's error classes: not JSON at all is a 400, JSON of the
//! wrong shape a 422, each with a `detail` saying what is wrong. The server's extractors
//! and the streaming upload parser ([`super::files::parser`]) answer the same way.

use serde::de::DeserializeOwned;

use super::Error;

/// Parses a JSON body with the API's error classes.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, Error> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(Error::BadRequest("expected a JSON body".into()));
    }
    serde_json::from_slice(bytes).map_err(|e| {
        use serde_json::error::Category;
        match e.classify() {
            // The typed parse stops at the first unknown or mistyped field, which may
            // come before a syntax error: a body that is not JSON at all is 400 either way.
            Category::Data => match serde_json::from_slice::<serde::de::IgnoredAny>(bytes) {
                Err(syntax) => Error::BadRequest(format!("malformed JSON: {syntax}")),
                Ok(_) => Error::Unprocessable(format!("invalid request: {e}")),
            },
            _ => Error::BadRequest(format!("malformed JSON: {e}")),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Body {
        image: String,
    }

    #[test]
    fn bodies_that_are_not_json_are_400_and_json_of_the_wrong_shape_422() {
        let status = |b: &str| {
            parse_json::<Body>(b.as_bytes())
                .map(|_| 200)
                .unwrap_or_else(|e| crate::server::error::status(&e))
        };
        assert_eq!(status(r#"{"image": "x"}"#), 200);
        for malformed in [
            "",
            " \n",
            "{",
            "nope",
            r#"{"image": "#,
            r#"{"other": 1,}"#,
            r#"{"image": 5"#,
        ] {
            assert_eq!(status(malformed), 400, "{malformed:?}");
        }
        for misshapen in [r#"{"image": 5}"#, "{}", r#"{"other": 1}"#, "[]", "null"] {
            assert_eq!(status(misshapen), 422, "{misshapen:?}");
        }
    }
}
