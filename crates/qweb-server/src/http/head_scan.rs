//! A look at HTTP/1 request-head bytes as they are read, before hyper parses them, for the
//! one thing hyper's parser hides: a `Content-Length` field next to `Transfer-Encoding`.
//! hyper drops the length and frames by the coding (RFC 9112 §6.3 allows it), but the RFC also
//! says such a request "ought to be handled as an error" and the connection MUST be closed;
//! nginx answers 400. The request rules need to know the field was there.

/// Scanner state: only the bytes from the start of a head to its blank line are looked at,
/// so body bytes never count.
#[derive(Clone, Copy, Default)]
pub(crate) struct HeadScan {
    scanning: bool,
    /// The current line's first bytes, lower-cased.
    line: [u8; 15],
    line_len: usize,
    lines: usize,
    saw_content_length: bool,
}

const FIELD: &[u8; 15] = b"content-length:";

impl HeadScan {
    /// A new head starts with the next bytes.
    pub(crate) fn start(&mut self) {
        *self = HeadScan {
            scanning: true,
            ..HeadScan::default()
        };
    }

    /// Looks at bytes read.
    pub(crate) fn feed(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if !self.scanning {
                return;
            }
            match b {
                b'\n' => {
                    let content = self.line_len;
                    if content == 0 && self.lines > 0 {
                        self.scanning = false; // blank line: end of the head
                    }
                    if content >= FIELD.len() && &self.line == FIELD {
                        self.saw_content_length = true;
                    }
                    self.lines += 1;
                    self.line_len = 0;
                }
                b'\r' => {}
                _ => {
                    if self.line_len < FIELD.len() {
                        self.line[self.line_len] = b.to_ascii_lowercase();
                    }
                    self.line_len += 1;
                }
            }
        }
    }

    /// The head read since [`HeadScan::start`] had a `Content-Length` field.
    pub(crate) fn saw_content_length(&self) -> bool {
        self.saw_content_length
    }
}

#[cfg(test)]
mod tests {
    use super::HeadScan;

    fn scan(parts: &[&[u8]]) -> bool {
        let mut s = HeadScan::default();
        s.start();
        for p in parts {
            s.feed(p);
        }
        s.saw_content_length()
    }

    #[test]
    fn finds_the_field_in_the_head_only() {
        assert!(scan(&[b"POST / HTTP/1.1\r\nContent-Length: 5\r\n\r\n"]));
        assert!(scan(&[
            b"POST / HTTP/1.1\r\nconTENT-",
            b"length: 5\r\n\r\n"
        ]));
        assert!(!scan(&[b"POST / HTTP/1.1\r\nX-Content-Length: 5\r\n\r\n"]));
        assert!(!scan(&[
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nContent-Length: 5\r\n"
        ]));
        assert!(!scan(&[b"GET /x HTTP/1.1\r\nHost: a\r\n\r\n"]));
    }
}
