//! A strict reader for the `.npy` header numpy itself writes — a Python dict literal such as
//! `{'descr': '<f4', 'fortran_order': False, 'shape': (1, 784), }` — in one pass without
//! allocating more than the shape. It answers `None` for anything else (another key, a
//! structured dtype, odd spacing numpy never writes is still accepted), and the caller then
//! reads the header with npyz's general literal parser: this path exists because that one
//! costs tens of microseconds per header, most of a small request's decoding in xpud.

/// What a canonical header says.
#[derive(Debug, PartialEq, Eq)]
pub struct Header<'h> {
    /// The dtype as written (`<f4`, `|b1`, `<U5`).
    pub descr: &'h str,
    pub fortran_order: bool,
    pub shape: Vec<usize>,
}

struct Cursor<'h> {
    text: &'h str,
    at: usize,
}

impl<'h> Cursor<'h> {
    fn skip_ws(&mut self) {
        let rest = &self.text[self.at..];
        self.at += rest.len() - rest.trim_start_matches([' ', '\t', '\n', '\r']).len();
    }

    fn eat(&mut self, c: u8) -> Option<()> {
        self.skip_ws();
        (self.text.as_bytes().get(self.at) == Some(&c)).then(|| self.at += 1)
    }

    fn peek(&mut self) -> Option<u8> {
        self.skip_ws();
        self.text.as_bytes().get(self.at).copied()
    }

    /// A single-quoted string without escapes.
    fn quoted(&mut self) -> Option<&'h str> {
        self.eat(b'\'')?;
        let rest = &self.text[self.at..];
        let end = rest.find('\'')?;
        let s = &rest[..end];
        if s.contains('\\') {
            return None;
        }
        self.at += end + 1;
        Some(s)
    }

    fn word(&mut self, w: &str) -> bool {
        self.skip_ws();
        let hit = self.text[self.at..].starts_with(w);
        if hit {
            self.at += w.len();
        }
        hit
    }

    fn number(&mut self) -> Option<usize> {
        self.skip_ws();
        let rest = &self.text[self.at..];
        let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        let n = rest.get(..digits).filter(|d| !d.is_empty())?.parse().ok()?;
        self.at += digits;
        Some(n)
    }

    /// `(d0, d1, …)`, `(d0,)` or `()`.
    fn shape(&mut self) -> Option<Vec<usize>> {
        self.eat(b'(')?;
        let mut dims = Vec::new();
        loop {
            if self.eat(b')').is_some() {
                return Some(dims);
            }
            dims.push(self.number()?);
            match self.peek()? {
                b',' => self.at += 1,
                b')' => {}
                _ => return None,
            }
        }
    }
}

/// A plain dtype: an optional byte order, a kind letter, a decimal item size.
fn plain_descr(d: &str) -> bool {
    let body = d.strip_prefix(['<', '>', '|', '=']).unwrap_or(d);
    let mut chars = body.chars();
    chars.next().is_some_and(|k| k.is_ascii_alphabetic())
        && !chars.as_str().is_empty()
        && chars.as_str().bytes().all(|b| b.is_ascii_digit())
}

/// Reads a header numpy writes; `None` for any other form (read it the general way).
pub fn parse(text: &str) -> Option<Header<'_>> {
    let mut c = Cursor { text, at: 0 };
    c.eat(b'{')?;
    let (mut descr, mut fortran_order, mut shape) = (None, None, None);
    loop {
        if c.eat(b'}').is_some() {
            break;
        }
        let key = c.quoted()?;
        c.eat(b':')?;
        match key {
            "descr" if descr.is_none() => descr = Some(c.quoted().filter(|d| plain_descr(d))?),
            "fortran_order" if fortran_order.is_none() => {
                fortran_order = Some(if c.word("True") {
                    true
                } else if c.word("False") {
                    false
                } else {
                    return None;
                });
            }
            "shape" if shape.is_none() => shape = Some(c.shape()?),
            _ => return None,
        }
        match c.peek()? {
            b',' => c.at += 1,
            b'}' => {}
            _ => return None,
        }
    }
    c.skip_ws();
    (c.at == text.len()).then_some(())?;
    Some(Header { descr: descr?, fortran_order: fortran_order?, shape: shape? })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(text: &str, expect: Option<(&str, bool, &[usize])>) {
        let got = parse(text);
        let want = expect.map(|(descr, fortran_order, shape)| Header {
            descr,
            fortran_order,
            shape: shape.to_vec(),
        });
        assert_eq!(got, want, "{text:?}");
    }

    #[test]
    fn numpy_headers_are_read_and_anything_else_is_left_to_npyz() {
        check(
            "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 784), }    \n",
            Some(("<f4", false, &[1, 784])),
        );
        check(
            "{'descr': '|b1', 'fortran_order': True, 'shape': (3,), }\n",
            Some(("|b1", true, &[3])),
        );
        check("{'descr': '<U5', 'fortran_order': False, 'shape': (), }", Some(("<U5", false, &[])));
        check(
            "{'shape': (2, 3), 'fortran_order': False, 'descr': '>i8'}",
            Some((">i8", false, &[2, 3])),
        );
        for other in [
            "",
            "{",
            "{}",
            "{'descr': '<f4', 'fortran_order': False}",
            "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,), }",
            "{'descr': '<f4', 'descr': '<f8', 'fortran_order': False, 'shape': (1,), }",
            "{'descr': '<f4', 'fortran_order': 0, 'shape': (1,), }",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (1, -2), }",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (1,, 2), }",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999999,), }",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'extra': 1}",
            "{'descr': '<f\\4', 'fortran_order': False, 'shape': (1,), }",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), } trailing",
            "{\"descr\": \"<f4\", \"fortran_order\": False, \"shape\": (1,)}",
            "{'descr': 'é4', 'fortran_order': False, 'shape': (1,), }",
        ] {
            check(other, None);
        }
        // Long and deep inputs end quickly.
        check(
            &format!(
                "{{'descr': '<f4', 'fortran_order': False, 'shape': ({}), }}",
                "1, ".repeat(5000)
            ),
            Some(("<f4", false, &vec![1; 5000])),
        );
        check(&"(".repeat(10_000), None);
    }
}
