//! The `table.native` kernel: `describe` computed in Rust. Reading a CSV file into DuckDB and
//! asking for eight statistics per column makes DuckDB parse every cell into its vectors and
//! collect each column once per quantile; describing a file directly needs one parallel scan
//! that keeps the numeric columns as plain `f64` vectors, and quantiles by selection. The
//! statistics follow pandas (`describe()`): missing values skipped, sample standard
//! deviation from the mean's deviations, numpy's pairwise summation and linear quantiles.
//! [`numeric_schema`] answers the compile-time column question for plainly numeric CSV files
//! the same way DuckDB's sniffer does, so such a job needs no database at all.

use std::collections::HashSet;
use std::path::PathBuf;

use xpu_ir::{Column, ColumnData, Table};

/// A CSV file as `read_csv` names it.
#[derive(Clone, Debug)]
pub struct CsvFile<'a> {
    pub path: &'a str,
    pub sep: u8,
    /// Missing-value markers; empty means pandas' defaults.
    pub na_values: &'a [String],
}

/// The values of one column, missing ones dropped.
#[derive(Debug)]
pub struct Values {
    pub name: String,
    pub values: Vec<f64>,
}

/// How the file was scanned, for the explanation.
#[derive(Debug)]
pub struct ScanReport {
    pub rows: usize,
    pub threads: usize,
}

/// Which columns to keep from a file.
#[derive(Clone, Copy, Debug)]
pub enum Wanted<'a> {
    /// These columns, each of which must hold numbers (the compile-time schema said so).
    Exactly(&'a [String]),
    /// Every column whose cells are all numbers or missing (pandas' numeric columns).
    Numeric,
    /// These columns, each of which must hold numbers, missing cells kept as NaN so that
    /// the columns stay row-aligned (a group-by reads keys and values row by row).
    Aligned(&'a [String]),
}

struct Markers {
    set: HashSet<Vec<u8>>,
    /// A marker that reads as a number other than NaN (`-999`): every cell is checked against
    /// the set before it is parsed.
    numeric: bool,
}

impl Markers {
    fn new(na_values: &[String]) -> Markers {
        let list: Vec<&str> = if na_values.is_empty() {
            crate::sql::PANDAS_NA_VALUES.to_vec()
        } else {
            na_values.iter().map(String::as_str).collect()
        };
        // `NaN`-like markers read as NaN, which counts as missing anyway.
        let numeric = list.iter().any(|m| parse_number(m.as_bytes()).is_some_and(|x| !x.is_nan()));
        Markers { set: list.iter().map(|m| m.as_bytes().to_vec()).collect(), numeric }
    }
}

/// A number as pandas reads one: surrounding spaces allowed, `inf` and `nan` spelled any
/// case. NaN comes back as `Some(NaN)`; the caller counts it as missing.
fn parse_number(field: &[u8]) -> Option<f64> {
    let f = field.trim_ascii();
    if f.is_empty() {
        return None;
    }
    plain_decimal(f).or_else(|| fast_float2::parse(f).ok())
}

/// The common shape of a number in a CSV file, `[+-]?digits[.digits]` with at most 15
/// significant digits, read exactly ([`decimal_at`]) when it is the whole field. Anything
/// else — exponents, more digits, `inf` — goes to the general parser.
fn plain_decimal(f: &[u8]) -> Option<f64> {
    let mut end = 0;
    decimal_at(f, &mut end).filter(|_| end == f.len())
}

/// One cell: `Ok(Some(x))` a number, `Ok(None)` missing, `Err(())` not a number.
fn cell(field: &[u8], na: &Markers) -> Result<Option<f64>, ()> {
    if na.numeric && na.set.contains(field) {
        return Ok(None);
    }
    match parse_number(field) {
        Some(x) if x.is_nan() => Ok(None),
        Some(x) => Ok(Some(x)),
        None if field.trim_ascii().is_empty() || na.set.contains(field) => Ok(None),
        None => Err(()),
    }
}

/// The 1-based line of byte `offset` of `buf`, past the blank lines the reader skipped.
fn line_at(buf: &[u8], mut offset: usize) -> usize {
    while offset < buf.len() && matches!(buf[offset], b'\n' | b'\r') {
        offset += 1;
    }
    1 + memchr::memchr_iter(b'\n', &buf[..offset.min(buf.len())]).count()
}

/// Where one chunk's values go: the kept columns' values, and the first non-number met in
/// a column that had to be numeric.
struct Sink<'a> {
    file: &'a CsvFile<'a>,
    buf: &'a [u8],
    width: usize,
    /// The file column of each kept column.
    keep: &'a [usize],
    strict: &'a [bool],
    /// Missing cells are kept, as NaN ([`Wanted::Aligned`]).
    aligned: bool,
    na: &'a Markers,
    columns: Vec<Option<Vec<f64>>>,
    rows: usize,
    bad: Option<(usize, usize, String)>,
}

impl Sink<'_> {
    /// One record already read as numbers, one per file column.
    fn push_row(&mut self, row: &[f64]) {
        for (col, out) in self.keep.iter().zip(self.columns.iter_mut()) {
            if let Some(values) = out.as_mut() {
                values.push(row[*col]);
            }
        }
        self.rows += 1;
    }

    /// One record whose first byte is at `at` in the file.
    fn record(&mut self, fields: &[&[u8]], at: usize) -> Result<(), String> {
        if fields.len() != self.width {
            return Err(format!(
                "{}: line {}: expected {} fields, saw {}",
                self.file.path,
                line_at(self.buf, at),
                self.width,
                fields.len()
            ));
        }
        for (k, (col, out)) in self.keep.iter().zip(self.columns.iter_mut()).enumerate() {
            let Some(values) = out.as_mut() else { continue };
            match cell(fields[*col], self.na) {
                Ok(Some(x)) => values.push(x),
                Ok(None) if self.aligned => values.push(f64::NAN),
                Ok(None) => {}
                Err(()) => {
                    if self.strict[k] && self.bad.is_none() {
                        let text = String::from_utf8_lossy(fields[*col]).into_owned();
                        self.bad = Some((at, k, text));
                    }
                    *out = None;
                }
            }
        }
        self.rows += 1;
        Ok(())
    }
}

/// The plain decimal (`[+-]?digits[.digits]`, at most 15 digits) that starts at `s[*i]`;
/// `*i` moves past it. `None` — `*i` unchanged — when there is none there. Read exactly: the
/// digits as an integer (exact in f64 below 2^53) divided by a power of ten that is itself
/// exact (≤ 10^15 here) is the correctly rounded value (Clinger's fast path, as every
/// correct parser takes it). Reading the number while finding where it ends saves a second
/// walk over each field.
#[inline]
fn decimal_at(s: &[u8], i: &mut usize) -> Option<f64> {
    const POW10: [f64; 16] =
        [1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15];
    let mut p = *i;
    let negative = s.get(p) == Some(&b'-');
    if negative || s.get(p) == Some(&b'+') {
        p += 1;
    }
    let mut mantissa: u64 = 0;
    let whole = read_digits(s, &mut p, &mut mantissa);
    let mut scale = 0;
    if s.get(p) == Some(&b'.') {
        p += 1;
        scale = read_digits(s, &mut p, &mut mantissa);
    }
    if whole + scale == 0 || whole + scale > 15 {
        return None;
    }
    *i = p;
    let value = mantissa as f64 / POW10[scale];
    Some(if negative { -value } else { value })
}

/// One record of exactly `row.len()` fields starting at `chunk[pos]`, read in one pass: the
/// fields `parse` marks as plain decimals into `row`, the others skipped (their values are
/// not wanted); returns where the next record starts. `None` — nothing consumed — for
/// anything else (a blank line, a missing or non-decimal cell among those parsed, spaces, a
/// ragged row), which the caller reads the general way.
#[inline]
fn decimal_record(
    chunk: &[u8],
    pos: usize,
    sep: u8,
    row: &mut [f64],
    parse: &[bool],
) -> Option<usize> {
    let mut i = pos;
    let last = row.len().checked_sub(1)?;
    for (k, value) in row.iter_mut().enumerate() {
        if parse[k] {
            *value = decimal_at(chunk, &mut i)?;
        } else {
            while i < chunk.len() && !matches!(chunk[i], b'\n' | b'\r') && chunk[i] != sep {
                i += 1;
            }
        }
        match chunk.get(i) {
            Some(&c) if c == sep && k < last => i += 1,
            Some(b'\n') if k == last => return Some(i + 1),
            Some(b'\r') if k == last && chunk.get(i + 1) == Some(&b'\n') => return Some(i + 2),
            None if k == last => return Some(i),
            _ => return None,
        }
    }
    None
}

/// Reads the records of `buf[start..end]`. `plain`: the file has no quote characters, so a
/// record is a line and a field what lies between separators (split with memchr); otherwise
/// the csv crate's reader handles quoting.
fn scan_chunk(sink: &mut Sink<'_>, start: usize, end: usize, plain: bool) -> Result<(), String> {
    let (buf, path, sep) = (sink.buf, sink.file.path, sink.file.sep);
    let chunk = &buf[start..end];
    if let Err(e) = std::str::from_utf8(chunk) {
        let line = line_at(buf, start + e.valid_up_to());
        return Err(format!("{path}: line {line}: invalid UTF-8"));
    }
    let mut fields: Vec<&[u8]> = Vec::with_capacity(sink.width);
    if plain {
        // Markers that read as numbers must be looked up before parsing, so only files
        // without such markers take the one-pass reader.
        let one_pass = !sink.na.numeric;
        let mut row = vec![0.0; sink.width];
        let mut parse = vec![false; sink.width];
        for &k in sink.keep {
            parse[k] = true;
        }
        let mut pos = 0;
        while pos < chunk.len() {
            if one_pass && let Some(next) = decimal_record(chunk, pos, sep, &mut row, &parse) {
                sink.push_row(&row);
                pos = next;
                continue;
            }
            let stop = memchr::memchr(b'\n', &chunk[pos..]).map_or(chunk.len(), |i| pos + i);
            let mut line = &chunk[pos..stop];
            if let [rest @ .., b'\r'] = line {
                line = rest;
            }
            if !line.is_empty() {
                fields.clear();
                let mut from = 0;
                for i in memchr::memchr_iter(sep, line) {
                    fields.push(&line[from..i]);
                    from = i + 1;
                }
                fields.push(&line[from..]);
                sink.record(&fields, start + pos)?;
            }
            pos = stop + 1;
        }
        return Ok(());
    }
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .delimiter(sep)
        .from_reader(chunk);
    let mut record = csv::ByteRecord::new();
    loop {
        match reader.read_byte_record(&mut record) {
            Ok(false) => return Ok(()),
            Ok(true) => {}
            Err(e) => {
                let at = e.position().map_or(start, |p| start + p.byte() as usize);
                return Err(format!("{path}: line {}: {e}", line_at(buf, at)));
            }
        }
        let at = start + record.position().map_or(0, |p| p.byte() as usize);
        let fields: Vec<&[u8]> = record.iter().collect();
        sink.record(&fields, at)?;
    }
}

/// Scans a CSV file with a header row once, on up to `threads` threads, and returns the
/// wanted columns' values. A file without quote characters is cut at line ends into one
/// chunk per thread; one with quotes (a quoted field may hold a line end) is read whole.
/// The file must lie inside `roots`.
pub fn scan_csv(
    file: &CsvFile<'_>,
    roots: &[PathBuf],
    wanted: Wanted<'_>,
    threads: usize,
) -> Result<(Vec<Values>, ScanReport), String> {
    let path = crate::confined(file.path, "file", roots)?;
    let handle = std::fs::File::open(&path).map_err(|e| format!("{}: {e}", file.path))?;
    // SAFETY: the map is read-only and lives only for this scan; a file truncated meanwhile
    // by another process is the one case memory maps cannot guard against, as for any reader.
    let map = unsafe { memmap2::MmapOptions::new().populate().map(&handle) }
        .map_err(|e| format!("{}: {e}", file.path))?;
    let buf: &[u8] = &map;
    if buf.is_empty() {
        return Err(format!("{} is empty: no columns to read", file.path));
    }
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(true)
        .flexible(true)
        .delimiter(file.sep)
        .from_reader(buf);
    let header: Vec<String> = reader
        .headers()
        .map_err(|e| format!("{}: line 1: {e}", file.path))?
        .iter()
        .map(|h| h.trim().to_string())
        .collect();
    let body_start = reader.position().byte() as usize;
    let width = header.len();
    let (names, strict): (Vec<String>, Vec<bool>) = match wanted {
        Wanted::Exactly(cols) | Wanted::Aligned(cols) => (cols.to_vec(), vec![true; cols.len()]),
        Wanted::Numeric => (header.clone(), vec![false; width]),
    };
    let keep: Vec<usize> = names
        .iter()
        .map(|n| {
            header
                .iter()
                .position(|h| h == n)
                .ok_or_else(|| format!("{}: no column named {n:?}", file.path))
        })
        .collect::<Result<_, _>>()?;
    let na = Markers::new(file.na_values);
    let aligned = matches!(wanted, Wanted::Aligned(_));
    let body = &buf[body_start..];
    let threads = threads.max(1);
    let plain = memchr::memchr(b'"', body).is_none();
    let mut bounds = vec![body_start];
    if plain && threads > 1 && body.len() > 1 << 20 {
        for t in 1..threads {
            let target = body_start + body.len() * t / threads;
            let last = *bounds.last().unwrap_or(&body_start);
            if target <= last {
                continue;
            }
            if let Some(nl) = memchr::memchr(b'\n', &buf[target..]) {
                bounds.push(target + nl + 1);
            }
        }
    }
    bounds.push(buf.len());
    bounds.dedup();
    let chunks: Vec<Result<Sink<'_>, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = bounds
            .windows(2)
            .map(|w| {
                let (start, end) = (w[0], w[1]);
                let (keep, strict, na) = (&keep, &strict, &na);
                s.spawn(move || {
                    let mut sink = Sink {
                        file,
                        buf,
                        width,
                        keep,
                        strict,
                        aligned,
                        na,
                        columns: keep
                            .iter()
                            .map(|_| Some(Vec::with_capacity((end - start) / (8 * width).max(1))))
                            .collect(),
                        rows: 0,
                        bad: None,
                    };
                    scan_chunk(&mut sink, start, end, plain)?;
                    Ok(sink)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(format!("{}: the scan failed", file.path))))
            .collect()
    });
    let mut out: Vec<Option<Vec<f64>>> = names.iter().map(|_| Some(Vec::new())).collect();
    let mut rows = 0;
    for chunk in chunks {
        let chunk = chunk?;
        if let Some((at, k, text)) = chunk.bad {
            return Err(format!(
                "{}: line {}: column {:?}: {text:?} is not a number",
                file.path,
                line_at(buf, at),
                names[k]
            ));
        }
        rows += chunk.rows;
        for (o, c) in out.iter_mut().zip(chunk.columns) {
            match (o.as_mut(), c) {
                (Some(o), Some(mut c)) if o.is_empty() => std::mem::swap(o, &mut c),
                (Some(o), Some(c)) => o.extend_from_slice(&c),
                _ => *o = None,
            }
        }
    }
    let values = names
        .into_iter()
        .zip(out)
        .filter_map(|(name, v)| v.map(|values| Values { name, values }))
        .collect();
    Ok((values, ScanReport { rows, threads: bounds.len() - 1 }))
}

/// `digits.digits` with digits on both sides and no leading zero (but `0.x`): a plain
/// decimal as DuckDB's sniffer reads it as DOUBLE, however many digits it has.
fn decimal_shape(d: &[u8]) -> bool {
    let Some(point) = d.iter().position(|&b| b == b'.') else { return false };
    let (whole, frac) = (&d[..point], &d[point + 1..]);
    !whole.is_empty()
        && !frac.is_empty()
        && whole.iter().chain(frac).all(u8::is_ascii_digit)
        && (whole.len() == 1 || whole[0] != b'0')
}

/// `mantissa(e|E)[+-]digits`, the mantissa an integer or a plain decimal: how pandas, numpy
/// and R write small and large floats (`1e-06`, `2.5E+10`), which DuckDB's sniffer reads as
/// DOUBLE.
fn exponent_shape(d: &[u8]) -> bool {
    let Some(e) = d.iter().position(|&b| b == b'e' || b == b'E') else { return false };
    let (mantissa, exp) = (&d[..e], &d[e + 1..]);
    let exp = exp.strip_prefix(b"-").or_else(|| exp.strip_prefix(b"+")).unwrap_or(exp);
    let plain_int = !mantissa.is_empty()
        && mantissa.iter().all(u8::is_ascii_digit)
        && (mantissa.len() == 1 || mantissa[0] != b'0');
    (plain_int || decimal_shape(mantissa))
        && !exp.is_empty()
        && exp.len() <= 3
        && exp.iter().all(u8::is_ascii_digit)
}

/// Appends the ASCII digits at `d[*i..]` to `mantissa`; returns how many it read. Eight
/// bytes at a time where eight remain (SWAR: the digit run's length from one mask, its value
/// from three multiplies, as simdjson parses eight digits), else two at a time (which halves
/// the chain of dependent multiply-adds that bounds a digit loop). Wrapping arithmetic: a
/// run of more than 15 digits is refused by the caller, whatever the sum became.
#[inline]
fn read_digits(d: &[u8], i: &mut usize, mantissa: &mut u64) -> usize {
    const POW10: [u64; 9] =
        [1, 10, 100, 1_000, 10_000, 100_000, 1_000_000, 10_000_000, 100_000_000];
    let start = *i;
    let mut push = |m: u64, digits: u64| *mantissa = mantissa.wrapping_mul(m).wrapping_add(digits);
    while let Some(bytes) = d.get(*i..*i + 8) {
        let word = u64::from_le_bytes(bytes.try_into().unwrap_or([0; 8]));
        let (n, value) = leading_digits(word);
        push(POW10[n], value);
        *i += n;
        if n < 8 {
            return *i - start;
        }
    }
    while *i + 1 < d.len() {
        let (a, b) = (d[*i].wrapping_sub(b'0'), d[*i + 1].wrapping_sub(b'0'));
        if a > 9 {
            return *i - start;
        }
        if b > 9 {
            push(10, a as u64);
            *i += 1;
            return *i - start;
        }
        push(100, (a * 10 + b) as u64);
        *i += 2;
    }
    if let Some(a) = d.get(*i).map(|c| c.wrapping_sub(b'0')).filter(|a| *a <= 9) {
        push(10, a as u64);
        *i += 1;
    }
    *i - start
}

/// How many of the eight bytes of `word` (the first in its low byte) are ASCII digits
/// before the first that is not, and their value.
#[inline]
fn leading_digits(word: u64) -> (usize, u64) {
    const ONES: u64 = 0x0101_0101_0101_0101;
    // Each byte minus '0': a digit becomes 0..=9; anything below '0' sets its top bit, and
    // adding 0x76 sets the top bit of anything above 9. Borrows and carries only run towards
    // later bytes, past the first non-digit, where nothing is read.
    let x = word.wrapping_sub(ONES * b'0' as u64);
    let not_digit = (x | x.wrapping_add(ONES * 0x76)) & (ONES * 0x80);
    let n = (not_digit.trailing_zeros() / 8) as usize;
    if n == 0 {
        return (0, 0);
    }
    // The run's bytes moved to the top: the bytes below read as leading zeros.
    let y = x << (8 * (8 - n));
    let y = y.wrapping_mul(10).wrapping_add(y >> 8);
    let lo = (y & 0x0000_00FF_0000_00FF).wrapping_mul(100 + (1_000_000 << 32));
    let hi = ((y >> 16) & 0x0000_00FF_0000_00FF).wrapping_mul(1 + (10_000 << 32));
    (n, lo.wrapping_add(hi) >> 32)
}

/// The schema of a CSV file whose every column is plainly numeric, read without DuckDB:
/// the header, then the first 20,480 rows and 2,048 rows at each of four later points of
/// the file (DuckDB's sniffer also samples beyond the start). A column whose non-missing
/// cells are all integers without a sign or leading zeros is i64, one of plain decimals or
/// numbers with an exponent (`1e-06`, as pandas writes small values) f64 — what DuckDB's
/// sniffer answers for such files. `None` — DuckDB decides — for anything else: quote
/// characters, strings, dates, booleans, a column with no value in the sample, duplicate or
/// empty names, ragged rows, invalid UTF-8.
pub fn numeric_schema(
    path: &str,
    sep: u8,
    na_values: &[String],
    roots: &[PathBuf],
) -> Option<Vec<(String, xpu_ir::DType)>> {
    use std::io::{Read, Seek, SeekFrom};
    const HEAD: usize = 4 << 20;
    const PROBE: usize = 256 << 10;
    let confined = crate::confined(path, "file", roots).ok()?;
    let mut f = std::fs::File::open(confined).ok()?;
    let len = f.metadata().ok()?.len() as usize;
    let mut head = Vec::with_capacity(HEAD.min(len));
    f.by_ref().take(HEAD as u64).read_to_end(&mut head).ok()?;
    let header_end = memchr::memchr(b'\n', &head)?;
    let header = std::str::from_utf8(&head[..header_end]).ok()?.trim_end_matches('\r');
    let names: Vec<String> = header.split(sep as char).map(str::to_string).collect();
    let mut seen = HashSet::new();
    if names.iter().any(|n| n.is_empty() || n.trim() != n || !seen.insert(n.clone())) {
        return None;
    }
    // Per column: (any value, all integers).
    let mut kinds = vec![(false, true); names.len()];
    let na = Markers::new(na_values);
    let mut take = |block: &[u8], rows: usize| -> Option<()> {
        if memchr::memchr(b'"', block).is_some() {
            return None;
        }
        let text = std::str::from_utf8(block).ok()?;
        for line in
            text.split('\n').map(|l| l.trim_end_matches('\r')).filter(|l| !l.is_empty()).take(rows)
        {
            let mut n = 0;
            for (i, field) in line.split(sep as char).enumerate() {
                let kind = kinds.get_mut(i)?;
                n += 1;
                let b = field.as_bytes();
                if b.is_empty() || na.set.contains(b) {
                    continue;
                }
                let digits = b.strip_prefix(b"-").unwrap_or(b);
                let integer = !digits.is_empty()
                    && digits.iter().all(u8::is_ascii_digit)
                    && (digits.len() == 1 || digits[0] != b'0')
                    && field.parse::<i64>().is_ok();
                let decimal = integer || decimal_shape(digits) || exponent_shape(digits);
                if !decimal {
                    return None;
                }
                kind.0 = true;
                kind.1 &= integer;
            }
            if n != names.len() {
                return None;
            }
        }
        Some(())
    };
    // The first rows, then four later probes each starting at a line start.
    let first = &head[header_end + 1..];
    let first = match memchr::memrchr(b'\n', first) {
        Some(end) if head.len() < len => &first[..=end],
        _ => first,
    };
    take(first, 20_480)?;
    if len > head.len() {
        let mut block = vec![0u8; PROBE];
        for k in 1..=4usize {
            let at = (len as u128 * k as u128 / 5) as u64;
            f.seek(SeekFrom::Start(at)).ok()?;
            let got = f.read(&mut block).ok()?;
            let part = &block[..got];
            let start = memchr::memchr(b'\n', part)? + 1;
            let end = memchr::memrchr(b'\n', part)?;
            if start < end {
                take(&part[start..end], 2_048)?;
            }
        }
    }
    kinds
        .iter()
        .zip(names)
        .map(|(&(any, int), name)| {
            any.then_some((name, if int { xpu_ir::DType::I64 } else { xpu_ir::DType::F64 }))
        })
        .collect()
}

/// The numeric (integer or float, not bool) columns of a materialised table, missing values
/// dropped; `only` restricts and orders them.
pub fn table_values(table: &Table, only: Option<&[String]>) -> Vec<Values> {
    let pick = |c: &Column| -> Option<Values> {
        let values = match &c.data {
            ColumnData::I64(v) => v.iter().flatten().map(|&x| x as f64).collect(),
            ColumnData::F64(v) => v.iter().flatten().copied().filter(|x| !x.is_nan()).collect(),
            _ => return None,
        };
        Some(Values { name: c.name.clone(), values })
    };
    match only {
        Some(names) => names
            .iter()
            .filter_map(|n| table.columns.iter().find(|c| &c.name == n))
            .filter_map(pick)
            .collect(),
        None => table.columns.iter().filter_map(pick).collect(),
    }
}

/// numpy's pairwise summation (`pairwise_sum` in numpy's loops): eight accumulators over
/// blocks of up to 128 values, halves added recursively. Matches `ndarray.sum` far closer
/// than a running sum does.
fn pairwise_sum(a: &[f64]) -> f64 {
    pairwise_sum_of(a, &|x| x)
}

/// The pairwise sum of `f(x)` over `a`, in numpy's order, without materialising the mapped
/// array (numpy's variance sums `(x - mean)²` this way over a temporary).
fn pairwise_sum_of(a: &[f64], f: &impl Fn(f64) -> f64) -> f64 {
    const BLOCK: usize = 128;
    if a.len() < 8 {
        return a.iter().fold(0.0, |s, &x| s + f(x));
    }
    if a.len() <= BLOCK {
        let mut r = [0.0; 8];
        for (k, acc) in r.iter_mut().enumerate() {
            *acc = f(a[k]);
        }
        let mut i = 8;
        while i + 8 <= a.len() {
            for (k, acc) in r.iter_mut().enumerate() {
                *acc += f(a[i + k]);
            }
            i += 8;
        }
        let mut s = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for &x in &a[i..] {
            s += f(x);
        }
        return s;
    }
    let half = (a.len() / 2) & !7;
    pairwise_sum_of(&a[..half], f) + pairwise_sum_of(&a[half..], f)
}

/// numpy's linear interpolation between neighbours (`_lerp`), exact at both ends.
fn lerp(a: f64, b: f64, t: f64) -> f64 {
    let diff = b - a;
    if t >= 0.5 { b - diff * (1.0 - t) } else { a + diff * t }
}

/// The statistics of one column, in the order `stats` names them; `None` where pandas gives
/// NaN (no values; a standard deviation of fewer than two).
fn column_stats(values: &mut [f64], stats: &[String]) -> Vec<Option<f64>> {
    let n = values.len();
    let mean = (n > 0).then(|| pairwise_sum(values) / n as f64);
    let std = match mean {
        Some(m) if n > 1 => {
            let squares = pairwise_sum_of(values, &|x| (x - m) * (x - m));
            Some((squares / (n - 1) as f64).sqrt())
        }
        _ => None,
    };
    let (mut min, mut max) = (f64::INFINITY, f64::NEG_INFINITY);
    for &x in values.iter() {
        min = min.min(x);
        max = max.max(x);
    }
    // Quantiles in ascending order, each selection on what lies above the previous one.
    let mut wanted: Vec<(usize, f64)> = stats
        .iter()
        .enumerate()
        .filter_map(|(i, s)| crate::sql::percentile(s).map(|q| (i, q)))
        .collect();
    wanted.sort_by(|a, b| a.1.total_cmp(&b.1));
    let mut quantiles = vec![None; stats.len()];
    let mut floor_done = 0usize;
    for (i, q) in wanted {
        if n == 0 {
            break;
        }
        let h = (n - 1) as f64 * q;
        let lo = (h.floor() as usize).min(n - 1);
        let t = h - lo as f64;
        if lo >= floor_done {
            values[floor_done..].select_nth_unstable_by(lo - floor_done, f64::total_cmp);
            floor_done = lo;
        }
        let a = values[lo];
        let b = if lo + 1 < n && t > 0.0 {
            values[lo + 1..].iter().copied().fold(f64::INFINITY, f64::min)
        } else {
            a
        };
        quantiles[i] = Some(lerp(a, b, t));
    }
    stats
        .iter()
        .zip(quantiles)
        .map(|(s, q)| match s.as_str() {
            "count" => Some(n as f64),
            "mean" => mean,
            "std" => std,
            "min" => (n > 0).then_some(min),
            "max" => (n > 0).then_some(max),
            _ => q,
        })
        .collect()
}

/// `describe`'s table: the statistic names as row labels, one column per input column.
/// Columns are worked on `threads` threads.
pub fn describe(mut columns: Vec<Values>, stats: &[String], threads: usize) -> Table {
    let per_thread = columns.len().div_ceil(threads.max(1)).max(1);
    let results: Vec<Vec<Option<f64>>> = std::thread::scope(|s| {
        let handles: Vec<_> = columns
            .chunks_mut(per_thread)
            .map(|group| {
                s.spawn(move || {
                    group.iter_mut().map(|c| column_stats(&mut c.values, stats)).collect::<Vec<_>>()
                })
            })
            .collect();
        handles.into_iter().flat_map(|h| h.join().unwrap_or_default()).collect()
    });
    let mut out = vec![Column {
        name: "statistic".into(),
        data: ColumnData::String(stats.iter().map(|s| Some(s.clone())).collect()),
    }];
    for (c, cells) in columns.into_iter().zip(results) {
        out.push(Column { name: c.name, data: ColumnData::F64(cells) });
    }
    Table { columns: out, index: true }
}

/// Bytes plain numeric CSV text is made of: a null marker made only of these could hide
/// anywhere, so it is always kept.
const NUMERIC_TEXT: &[u8] = b"0123456789+-.eE \t\r\n,;|";

/// Of the null markers `na_values` (pandas' list when empty), those that can occur in the
/// file at `path`: a marker holding a byte that is not in the file cannot. Each marker has a
/// witness, its first byte that plain numbers do not use (`#`, `N`, `n`, `<` for pandas'
/// list), and the file is searched for the witnesses (memchr, a few passes at memory speed).
/// DuckDB compares every field with every marker it is given — with pandas' 19, that is most
/// of reading a plainly numeric file — so the markers that cannot occur are better left
/// out; the result is the same. `None` when the file cannot be read.
pub fn possible_null_markers(
    path: &str,
    na_values: &[String],
    roots: &[PathBuf],
) -> Option<Vec<String>> {
    let markers: Vec<String> = if na_values.is_empty() {
        crate::sql::PANDAS_NA_VALUES.iter().map(|s| s.to_string()).collect()
    } else {
        na_values.to_vec()
    };
    let witness = |m: &str| m.bytes().find(|b| !NUMERIC_TEXT.contains(b));
    let mut wanted: Vec<u8> = markers.iter().filter_map(|m| witness(m)).collect();
    wanted.sort_unstable();
    wanted.dedup();
    let confined = crate::confined(path, "file", roots).ok()?;
    let mut file = std::fs::File::open(confined).ok()?;
    let mut missing = wanted;
    let mut chunk = vec![0u8; 4 << 20];
    while !missing.is_empty() {
        let n = std::io::Read::read(&mut file, &mut chunk).ok()?;
        if n == 0 {
            break;
        }
        let found = witnesses_in(&chunk[..n], &missing);
        missing.retain(|b| !found.contains(b));
    }
    Some(markers.into_iter().filter(|m| witness(m).is_none_or(|w| !missing.contains(&w))).collect())
}

/// Which of the bytes `wanted` occur in `bytes`: memchr over up to three at a time, each
/// pass resuming after a hit with the bytes not yet found (nothing of them lies before it).
fn witnesses_in(bytes: &[u8], wanted: &[u8]) -> Vec<u8> {
    let mut found = Vec::new();
    for group in wanted.chunks(3) {
        let mut left = group.to_vec();
        let mut rest = bytes;
        while let Some(at) = match left[..] {
            [a] => memchr::memchr(a, rest),
            [a, b] => memchr::memchr2(a, b, rest),
            [a, b, c, ..] => memchr::memchr3(a, b, c, rest),
            [] => None,
        } {
            found.push(rest[at]);
            left.retain(|&b| b != rest[at]);
            rest = &rest[at + 1..];
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats() -> Vec<String> {
        crate::sql::DESCRIBE_STATS.iter().map(|s| s.to_string()).collect()
    }

    /// The eight-byte digit reader against a digit-by-digit one, over every digit-run length
    /// and every byte that can end a run (including UTF-8 lead bytes and what borrows or
    /// carries in the word arithmetic: '/', ':', NUL, 0xFF).
    #[test]
    fn eight_byte_digit_runs_read_as_digit_by_digit() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for n in 0..=8 {
            for end in (0u8..=255).filter(|b| !b.is_ascii_digit()) {
                let mut word = [0u8; 8];
                for b in word.iter_mut().take(n) {
                    *b = b'0' + (next() % 10) as u8;
                }
                if n < 8 {
                    word[n] = end;
                    for b in word.iter_mut().skip(n + 1) {
                        *b = next() as u8;
                    }
                }
                let want: u64 = word[..n].iter().fold(0, |m, d| m * 10 + u64::from(d - b'0'));
                assert_eq!(leading_digits(u64::from_le_bytes(word)), (n, want), "{word:?}");
            }
        }
        // Through read_digits: runs longer than eight, near the end of the slice.
        for text in ["123456789012345.5", "12345678", "1234567", "9,", "007.25"] {
            let (mut i, mut m) = (0, 0u64);
            let n = read_digits(text.as_bytes(), &mut i, &mut m);
            let digits: String = text.chars().take_while(char::is_ascii_digit).collect();
            assert_eq!((n, m), (digits.len(), digits.parse().unwrap()), "{text}");
        }
    }

    /// Garbage in the aligned scan (bytes drawn from what CSV numbers are made of, long and
    /// ragged lines): an error naming the file and a line, or columns of one length each.
    #[test]
    fn aligned_scans_of_garbage_keep_rows_aligned_or_fail_clearly() {
        let dir = tempfile::tempdir().unwrap();
        let roots = [dir.path().canonicalize().unwrap()];
        let path = roots[0].join("g.csv").to_string_lossy().into_owned();
        let alphabet = b"0123456789012345678901234567890123456789,,,,,..--\n\n\r e+NAn\"";
        let mut seed = 0x1234_5678_9abc_def1u64;
        let (mut read, mut refused) = (0, 0);
        for case in 0..400 {
            let mut text = b"a,b,c\n".to_vec();
            let len = if case % 50 == 0 { 3 << 20 } else { (case * 37) % 3000 };
            // Whole lines where the shape is kept.
            let len = if case % 2 == 1 { len - len % 12 } else { len };
            for i in 0..len {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                // Odd cases keep the shape (three fields a line) and garble only the cells.
                let byte = match (case % 2, i % 12) {
                    (1, 11) => b'\n',
                    (1, 3 | 7) => b',',
                    // Every fourth case: cells of digits only, which read.
                    (1, _) if case % 4 == 1 => b'0' + (seed % 10) as u8,
                    _ => alphabet[(seed % alphabet.len() as u64) as usize],
                };
                let byte = if case % 2 == 1
                    && !matches!(i % 12, 3 | 7 | 11)
                    && matches!(byte, b'\n' | b'\r' | b',' | b'"')
                {
                    b'7'
                } else {
                    byte
                };
                text.push(byte);
            }
            std::fs::write(&path, &text).unwrap();
            let file = CsvFile { path: &path, sep: b',', na_values: &[] };
            let wanted = ["c".to_string(), "a".to_string()];
            match scan_csv(&file, &roots, Wanted::Aligned(&wanted), 2) {
                Ok((values, report)) => {
                    read += 1;
                    assert_eq!(values.len(), 2);
                    assert!(values.iter().all(|v| v.values.len() == report.rows), "case {case}");
                }
                Err(e) => {
                    refused += 1;
                    assert!(e.starts_with(&path) && e.contains("line "), "case {case}: {e}");
                }
            }
        }
        assert!(read > 0 && refused > 0, "{read} read, {refused} refused");
    }

    #[test]
    fn null_markers_that_cannot_occur_are_left_out() {
        let dir = tempfile::tempdir().unwrap();
        let roots = [dir.path().canonicalize().unwrap()];
        let write = |name: &str, text: &str| {
            std::fs::write(dir.path().join(name), text).unwrap();
            roots[0].join(name).to_string_lossy().into_owned()
        };
        let pandas = |path: &str| possible_null_markers(path, &[], &roots).unwrap();
        // Plain numbers: only the empty marker can occur.
        assert_eq!(pandas(&write("n.csv", "k,c1\n1,-1.5e-05\n2,\n")), [""]);
        // A `nan` cell keeps every marker with an `n` in it (and nothing is lost: DuckDB
        // still decides per field).
        let kept = pandas(&write("m.csv", "k,c1\n1,nan\n"));
        assert!(kept.contains(&"nan".to_string()) && kept.contains(&"null".to_string()));
        assert!(!kept.contains(&"NA".to_string()) && !kept.contains(&"#N/A".to_string()));
        // A file larger than one read, with its only `#` at the very end.
        let mut big = "k,c1\n".to_string() + &"1,2.5\n".repeat(1 << 20);
        big.push_str("3,#N/A\n");
        let kept = pandas(&write("big.csv", &big));
        assert!(kept.contains(&"#N/A".to_string()) && kept.contains(&"1.#IND".to_string()));
        // The node's own markers, one made of number bytes only (always kept).
        let own = ["-999".to_string(), "missing".to_string()];
        let path = write("o.csv", "k\n-999\n");
        assert_eq!(possible_null_markers(&path, &own, &roots).unwrap(), ["-999"]);
        // Outside the roots: no answer (the reader reports it).
        assert!(possible_null_markers("/etc/passwd", &[], &roots).is_none());
    }

    #[test]
    fn quantiles_interpolate_like_numpy() {
        // numpy.percentile([4, 1, 3, 2], [25, 50, 75]) == [1.75, 2.5, 3.25]
        let mut v = vec![4.0, 1.0, 3.0, 2.0];
        let s = column_stats(&mut v, &stats());
        assert_eq!(s[0], Some(4.0));
        assert_eq!(s[1], Some(2.5));
        assert!((s[2].unwrap() - 1.2909944487358056).abs() < 1e-15);
        assert_eq!(&s[3..], &[Some(1.0), Some(1.75), Some(2.5), Some(3.25), Some(4.0)]);
    }

    #[test]
    fn empty_and_single_columns_give_pandas_nans() {
        let s = column_stats(&mut [], &stats());
        assert_eq!(s[0], Some(0.0));
        assert!(s[1..].iter().all(Option::is_none));
        let s = column_stats(&mut [7.0], &stats());
        assert_eq!(
            s,
            [Some(1.0), Some(7.0), None, Some(7.0), Some(7.0), Some(7.0), Some(7.0), Some(7.0)]
        );
    }

    #[test]
    fn pairwise_sum_is_numpys() {
        // 0.1 summed 1000 times: numpy's `np.full(1000, 0.1).sum()`; a running sum gives
        // 99.9999999999986.
        assert_eq!(pairwise_sum(&vec![0.1; 1000]), 100.00000000000001);
    }

    #[test]
    fn plain_decimals_are_read_exactly() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..20_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let text = match state % 4 {
                0 => format!("{:.6}", (state >> 11) as f64 / 1e9 - 4e3),
                1 => format!("{}", (state >> 20) as i64 - (1 << 43)),
                2 => format!("-0.{:015}", state % 1_000_000_000_000_000),
                _ => format!("{:.2}", (state >> 30) as f64 / 7.0),
            };
            let want: f64 = text.parse().unwrap();
            assert_eq!(parse_number(text.as_bytes()), Some(want), "{text}");
            let (mut end, exact) = (0, plain_decimal(text.as_bytes()));
            assert_eq!(decimal_at(text.as_bytes(), &mut end), exact, "{text}");
            assert_eq!(end, if exact.is_some() { text.len() } else { 0 }, "{text}");
        }
        for odd in ["1e5", "-.5", "5.", "1.2.3", "--1", "0x10", "12345678901234567890"] {
            assert_eq!(parse_number(odd.as_bytes()), odd.parse::<f64>().ok(), "{odd}");
        }
    }

    /// The one-pass reader takes a record only when every cell is a plain decimal, and then
    /// reads exactly what splitting the line and parsing each cell reads.
    #[test]
    fn one_pass_records_agree_with_split_and_parse() {
        let lines: &[(&str, Option<&[f64]>)] = &[
            ("1,-2.5,3.25\n", Some(&[1.0, -2.5, 3.25])),
            ("1,-2.5,3.25\r\n", Some(&[1.0, -2.5, 3.25])),
            ("1,-2.5,3.25", Some(&[1.0, -2.5, 3.25])),
            ("+0.000001,.5,7.\n", Some(&[0.000001, 0.5, 7.0])),
            ("1,2\n", None),
            ("1,2,3,4\n", None),
            ("1,,3\n", None),
            ("1, 2,3\n", None),
            ("1,1e-06,3\n", None),
            ("1,NA,3\n", None),
            ("1,2,3\r", None),
            ("\n", None),
            ("1,1234567890123456,3\n", None),
            ("1,2;3,4\n", None),
        ];
        for (line, want) in lines {
            let mut row = [0.0; 3];
            let got = decimal_record(line.as_bytes(), 0, b',', &mut row, &[true; 3]);
            assert_eq!(got.is_some(), want.is_some(), "{line:?}");
            if let Some(want) = want {
                assert_eq!(got, Some(line.len()), "{line:?}");
                assert_eq!(&row[..], *want, "{line:?}");
                let split: Vec<f64> = line
                    .trim_end()
                    .split(',')
                    .map(|f| parse_number(f.as_bytes()).unwrap())
                    .collect();
                assert_eq!(&row[..], &split[..], "{line:?}");
            }
        }
        // A skipped field is not read: anything but a separator or a line end may fill it,
        // and the record still has to have every field.
        let skip_middle = [true, false, true];
        for (line, want) in [
            ("1,x y;z,3\n", Some([1.0, 3.0])),
            ("1,,3\r\n", Some([1.0, 3.0])),
            ("1,NA\n", None),
            ("1,2,3,4\n", None),
            ("1,a\rb,3\n", None),
        ] {
            let mut row = [0.0; 3];
            let got = decimal_record(line.as_bytes(), 0, b',', &mut row, &skip_middle);
            assert_eq!(got.map(|_| [row[0], row[2]]), want, "{line:?}");
        }
    }

    #[test]
    fn cells_read_as_pandas_reads_them() {
        let na = Markers::new(&[]);
        assert!(!na.numeric, "pandas' markers need no lookup before parsing");
        assert_eq!(cell(b" 1.5 ", &na), Ok(Some(1.5)));
        assert_eq!(cell(b"", &na), Ok(None));
        assert_eq!(cell(b"NA", &na), Ok(None));
        assert_eq!(cell(b"nan", &na), Ok(None));
        assert_eq!(cell(b"-inf", &na), Ok(Some(f64::NEG_INFINITY)));
        assert_eq!(cell(b"oops", &na), Err(()));
        let custom = Markers::new(&["-999".to_string()]);
        assert_eq!(cell(b"-999", &custom), Ok(None));
    }
}
