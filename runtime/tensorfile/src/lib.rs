//! Tensor files: `.npy` (numpy) and ONNX TensorProto `.pb`, read as inputs and written as
//! outputs; tables as CSV; the REST API's literal form (dtype, shape, row-major numbers);
//! tensors printed the way numpy prints them. Every reader takes untrusted bytes: it answers
//! with an error naming the file and what is wrong, never a panic (fuzzed: `make fuzz`).

mod npy_header;

use std::path::Path;

use half::f16;
use npyz::WriterBuilder;
use xpu_ir::{Tensor, TensorData};

/// A tensor or table file that cannot be read or written; the message names the file.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct TensorFileError(pub String);

type Result<T> = std::result::Result<T, TensorFileError>;

macro_rules! bail {
    ($($t:tt)*) => { return Err(TensorFileError(format!($($t)*))) };
}

impl From<std::io::Error> for TensorFileError {
    fn from(e: std::io::Error) -> Self {
        TensorFileError(e.to_string())
    }
}

impl From<csv::Error> for TensorFileError {
    fn from(e: csv::Error) -> Self {
        TensorFileError(e.to_string())
    }
}

/// Reads a `.npy`, `.pb` or `.csv` file (a table); returns the name stored in a `.pb`, if
/// any.
pub fn read(path: &Path) -> Result<(Option<String>, Tensor)> {
    let cannot =
        |e: std::io::Error| TensorFileError(format!("cannot read {}: {e}", path.display()));
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
    if ext == "npy" {
        let mut file = std::fs::File::open(path).map_err(cannot)?;
        if let Some(t) = read_plain_npy_file(&mut file).map_err(cannot)? {
            return Ok((None, t));
        }
    }
    let bytes = std::fs::read(path).map_err(cannot)?;
    read_bytes(&path.display().to_string(), ext, &bytes)
}

/// A `.npy` file of a plain little-endian numeric dtype, C-ordered, read from its header
/// straight into the tensor's elements (no copy of the whole file first: half the memory
/// and page faults on large inputs, which are also advised to use huge pages). `None` for
/// anything else — another dtype or order, or a header that does not parse — which the
/// whole-file reader then reads or refuses with its message.
fn read_plain_npy_file(file: &mut std::fs::File) -> std::io::Result<Option<Tensor>> {
    use std::io::Read;
    let file_len = usize::try_from(file.metadata()?.len()).unwrap_or(usize::MAX);
    let mut head = [0u8; 12].to_vec();
    if file.read_exact(&mut head).is_err() {
        return Ok(None);
    }
    let header_len = match head[6] {
        1 => 10 + usize::from(u16::from_le_bytes([head[8], head[9]])),
        2 | 3 => 12 + u32::from_le_bytes([head[8], head[9], head[10], head[11]]) as usize,
        _ => return Ok(None),
    };
    // (A header shorter than the 12 bytes read is no header numpy writes: the whole-file
    // reader refuses it.)
    if header_len < head.len() || header_len > 12 + NPY_MAX_HEADER || header_len > file_len {
        return Ok(None);
    }
    head.resize(header_len, 0);
    if file.read_exact(&mut head[12..]).is_err() {
        return Ok(None);
    }
    let Ok(layout) = npy_layout(&head, file_len) else { return Ok(None) };
    if !cfg!(target_endian = "little") || !matches!(layout.byte_order, '<' | '|') {
        return Ok(None);
    }
    let Some(n) = layout.shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d)) else {
        return Ok(None);
    };
    let mut fill = |buf: &mut [u8]| match buf.len() <= file_len - header_len {
        true => file.read_exact(buf),
        false => Err(std::io::ErrorKind::UnexpectedEof.into()),
    };
    let Some(data) = plain_elements_of(&layout.code, n, &mut fill) else { return Ok(None) };
    // A payload shorter than its shape: the whole-file reader says so.
    let Ok(data) = data else { return Ok(None) };
    Ok(Tensor::new(layout.shape, data).ok())
}

/// Reads the bytes of a `.npy` (`ext` "npy"), `.pb` or `.csv` file called `name` (for
/// messages). A CSV file is one table value; its columns are typed as [`table_from_csv`]
/// types them.
pub fn read_bytes(name: &str, ext: &str, bytes: &[u8]) -> Result<(Option<String>, Tensor)> {
    match ext {
        "pb" => xpu_onnx::read_tensor_proto(bytes)
            .map_err(|e| TensorFileError(format!("{name}: not a valid ONNX TensorProto: {e}"))),
        "npy" => read_npy(bytes)
            .map(|t| (None, t))
            .map_err(|e| TensorFileError(format!("{name}: not a valid .npy file: {e}"))),
        "csv" => {
            let table = table_from_csv(bytes)
                .map_err(|e| TensorFileError(format!("{name}: not a readable CSV table: {e}")))?;
            Ok((None, table_value(table)))
        }
        other => {
            bail!("{name}: unknown input file type `.{other}` (expected .npy, .pb or .csv)")
        }
    }
}

/// Builds a tensor from the REST API's literal form: `dtype` (default f32; f32, f64, i64, i32
/// or bool), `shape` and the row-major numbers. Numbers are converted as numpy's `astype`
/// does (saturating for integers, non-zero for bool).
pub fn from_literal(dtype: Option<&str>, shape: &[usize], data: &[f64]) -> Result<Tensor> {
    match xpu_ir::shape::checked_numel(shape) {
        None => bail!("shape {shape:?} holds more values than can be addressed"),
        Some(n) if n != data.len() => {
            bail!("shape {shape:?} holds {n} values, data has {}", data.len())
        }
        Some(_) => {}
    }
    let shape = shape.to_vec();
    let t = match dtype.unwrap_or("f32") {
        "f32" => Tensor::from_vec(shape, data.iter().map(|&v| v as f32).collect::<Vec<_>>()),
        "f64" => Tensor::from_vec(shape, data.to_vec()),
        "i64" => Tensor::from_vec(shape, data.iter().map(|&v| v as i64).collect::<Vec<_>>()),
        "i32" => Tensor::from_vec(shape, data.iter().map(|&v| v as i32).collect::<Vec<_>>()),
        "bool" => Tensor::from_vec(shape, data.iter().map(|&v| v != 0.0).collect::<Vec<_>>()),
        other => bail!("dtype `{other}` (use f32, f64, i64, i32 or bool)"),
    };
    t.map_err(|e| TensorFileError(e.to_string()))
}

/// The longest `.npy` header accepted (numpy's own reader refuses more than 10,000 bytes by
/// default, `max_header_size`).
const NPY_MAX_HEADER: usize = 10_000;

/// How deep brackets may nest in a `.npy` header: a real one is a dict holding a tuple (2);
/// a structured dtype adds a list of tuples (4).
const NPY_MAX_NESTING: usize = 8;

/// Checks a `.npy` header's length and bracket nesting in one linear pass before it reaches
/// npyz, whose literal parser backtracks (a header of ~1,500 `[` took minutes there);
/// returns where the header's text starts and where the payload starts.
fn check_npy_header(bytes: &[u8]) -> Result<(usize, usize)> {
    let Some(rest) = bytes.strip_prefix(b"\x93NUMPY") else {
        bail!("the file does not start with numpy's magic `\\x93NUMPY`");
    };
    let (len, start) = match rest {
        [1, _, a, b, ..] => (u16::from_le_bytes([*a, *b]) as usize, 10),
        [2 | 3, _, a, b, c, d, ..] => (u32::from_le_bytes([*a, *b, *c, *d]) as usize, 12),
        [v, ..] => bail!("unknown .npy format version {v}"),
        [] => bail!("the file ends inside the header"),
    };
    if len > NPY_MAX_HEADER {
        bail!("the header is {len} bytes; at most {NPY_MAX_HEADER} are accepted");
    }
    let header = bytes.get(start..start + len).ok_or_else(|| {
        TensorFileError(format!("the header claims {len} bytes but the file ends before"))
    })?;
    let mut depth = 0usize;
    let mut quote: Option<u8> = None;
    for (i, &b) in header.iter().enumerate() {
        match (quote, b) {
            (Some(q), _) if b == q => quote = None,
            (Some(_), _) => {}
            (None, b'\'' | b'"') => quote = Some(b),
            (None, b'(' | b'[' | b'{') => {
                depth += 1;
                if depth > NPY_MAX_NESTING {
                    bail!(
                        "the header nests brackets more than {NPY_MAX_NESTING} deep (at byte {})",
                        start + i
                    );
                }
            }
            (None, b')' | b']' | b'}') => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    Ok((start, start + len))
}

/// `n` elements of a plain little-endian type, their bytes written by `fill` (a copy from a
/// payload, or a read from a file): no per-element decoding; a large buffer is advised to
/// use huge pages before it is filled.
fn plain_le<T: bytemuck::Pod>(
    n: usize,
    fill: &mut dyn FnMut(&mut [u8]) -> std::io::Result<()>,
) -> std::io::Result<Vec<T>> {
    n.checked_mul(std::mem::size_of::<T>()).ok_or(std::io::ErrorKind::InvalidData)?;
    let mut v = vec![T::zeroed(); n];
    xpu_ir::memory::advise_huge_pages(v.as_ptr().cast(), std::mem::size_of_val(v.as_slice()));
    fill(bytemuck::cast_slice_mut::<T, u8>(&mut v))?;
    Ok(v)
}

/// The elements of a plain little-endian numeric dtype `code` (`f4`, `i8`, …), filled by
/// `fill`; `None` for any other dtype.
fn plain_elements_of(
    code: &str,
    n: usize,
    fill: &mut dyn FnMut(&mut [u8]) -> std::io::Result<()>,
) -> Option<std::io::Result<TensorData>> {
    Some(match code {
        "f4" => plain_le(n, fill).map(TensorData::F32),
        "f8" => plain_le(n, fill).map(TensorData::F64),
        "i1" => plain_le(n, fill).map(TensorData::I8),
        "i2" => plain_le(n, fill).map(TensorData::I16),
        "i4" => plain_le(n, fill).map(TensorData::I32),
        "i8" => plain_le(n, fill).map(TensorData::I64),
        "u1" => plain_le(n, fill).map(TensorData::U8),
        "u2" => plain_le(n, fill).map(TensorData::U16),
        "u4" => plain_le(n, fill).map(TensorData::U32),
        "u8" => plain_le(n, fill).map(TensorData::U64),
        _ => return None,
    })
}

/// A C-ordered array of a plain little-endian numeric dtype, read by copying its payload.
/// `None` for another dtype or byte order, or a payload too short (npyz then reports it).
fn read_plain_npy(
    payload: &[u8],
    code: &str,
    byte_order: char,
    shape: &[usize],
) -> Option<TensorData> {
    if !cfg!(target_endian = "little") || !matches!(byte_order, '<' | '|') {
        return None;
    }
    let n = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d))?;
    let mut fill = |buf: &mut [u8]| match payload.get(..buf.len()) {
        Some(bytes) => {
            buf.copy_from_slice(bytes);
            Ok(())
        }
        None => Err(std::io::ErrorKind::UnexpectedEof.into()),
    };
    plain_elements_of(code, n, &mut fill)?.ok()
}

/// What a `.npy` header says: where the elements start, their shape and dtype.
struct NpyLayout<'h> {
    payload_at: usize,
    shape: Vec<usize>,
    /// The dtype as written (`<f4`).
    type_str: String,
    /// The dtype less its byte order (`f4`).
    code: String,
    byte_order: char,
    /// npyz's reading of the header, when it was needed (not the header numpy writes).
    npy: Option<npyz::NpyFile<&'h [u8]>>,
}

/// Parses and checks the header at the start of `bytes` (the whole file, or its header):
/// C order, a plain dtype, and a shape whose elements fit in `file_len` bytes — refused
/// before anything is allocated.
fn npy_layout(bytes: &[u8], file_len: usize) -> Result<NpyLayout<'_>> {
    let (header_at, payload_at) = check_npy_header(bytes)?;
    let canonical =
        std::str::from_utf8(&bytes[header_at..payload_at]).ok().and_then(npy_header::parse);
    let (shape, fortran, type_str, npy) = match canonical {
        Some(h) => (h.shape, h.fortran_order, h.descr.to_string(), None),
        None => {
            let npy = npyz::NpyFile::new(bytes)?;
            let shape: Vec<usize> = npy.shape().iter().map(|&d| d as usize).collect();
            let type_str = match npy.dtype() {
                npyz::DType::Plain(t) => t.to_string(),
                other => bail!("structured dtype {other:?} is not supported"),
            };
            (shape, npy.order() == npyz::Order::Fortran, type_str, Some(npy))
        }
    };
    if fortran {
        bail!("Fortran-ordered arrays are not supported; save with np.ascontiguousarray");
    }
    let code = type_str.trim_start_matches(['<', '>', '|', '=']).to_string();
    let item: usize = match code.as_bytes().first() {
        Some(b'U') => 4 * code[1..].parse::<usize>().unwrap_or(1),
        _ => code[1..].parse().unwrap_or(1),
    };
    let need = shape.iter().try_fold(item, |acc, &d| acc.checked_mul(d));
    match need {
        Some(n) if n <= file_len => {}
        _ => bail!(
            "the header's shape {shape:?} of `{type_str}` needs more data than the file's {file_len} bytes"
        ),
    }
    let byte_order = type_str.chars().next().unwrap_or('=');
    Ok(NpyLayout { payload_at, shape, type_str, code, byte_order, npy })
}

pub fn read_npy(bytes: &[u8]) -> Result<Tensor> {
    let NpyLayout { payload_at, shape, type_str, code, byte_order, npy } =
        npy_layout(bytes, bytes.len())?;
    let code = code.as_str();
    if let Some(data) =
        bytes.get(payload_at..).and_then(|p| read_plain_npy(p, code, byte_order, &shape))
    {
        return Tensor::new(shape, data).map_err(|e| TensorFileError(e.to_string()));
    }
    let npy = match npy {
        Some(npy) => npy,
        None => npyz::NpyFile::new(bytes)?,
    };
    let data = match code {
        "f4" => TensorData::F32(npy.into_vec()?),
        "f8" => TensorData::F64(npy.into_vec()?),
        "f2" => TensorData::F16(npy.into_vec::<f16>()?),
        "i1" => TensorData::I8(npy.into_vec()?),
        "i2" => TensorData::I16(npy.into_vec()?),
        "i4" => TensorData::I32(npy.into_vec()?),
        "i8" => TensorData::I64(npy.into_vec()?),
        "u1" => TensorData::U8(npy.into_vec()?),
        "u2" => TensorData::U16(npy.into_vec()?),
        "u4" => TensorData::U32(npy.into_vec()?),
        "u8" => TensorData::U64(npy.into_vec()?),
        "b1" => TensorData::Bool(npy.into_vec::<bool>()?),
        c if c.starts_with('U') => {
            let raw: Vec<Vec<char>> = npy.into_vec()?;
            TensorData::String(
                raw.into_iter()
                    .map(|cs| cs.into_iter().take_while(|&c| c != '\0').collect())
                    .collect(),
            )
        }
        other => bail!("numpy dtype `{type_str}` ({other}) is not supported"),
    };
    Tensor::new(shape, data).map_err(|e| TensorFileError(e.to_string()))
}

/// Writes a tensor as `.npy`. bf16 has no numpy dtype: it is written as f32.
pub fn write_npy(path: &Path, t: &Tensor) -> Result<()> {
    let failed =
        |e: std::io::Error| TensorFileError(format!("cannot write {}: {e}", path.display()));
    if let Some((header, payload)) = plain_npy(t) {
        // Header then the elements' own bytes: no encoded copy of a large output.
        use std::io::Write;
        let mut f = std::fs::File::create(path).map_err(failed)?;
        f.write_all(&header).and_then(|()| f.write_all(payload)).map_err(failed)?;
        return Ok(());
    }
    std::fs::write(path, npy_bytes(t)?).map_err(failed)?;
    Ok(())
}

/// A version 1.0 `.npy` header for a C-ordered array of `descr` and `shape`, padded to a
/// multiple of 64 bytes as numpy writes it.
fn npy_header(descr: &str, shape: &[usize]) -> Vec<u8> {
    let dims = match shape {
        [d] => format!("({d},)"),
        _ => format!("({})", shape.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")),
    };
    let mut dict = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {dims}, }}");
    // Version 1 holds a header length in 2 bytes; a longer header (thousands of dims)
    // needs version 2's 4, as numpy writes it.
    let v1 = (10 + dict.len() + 1).next_multiple_of(64) - 10 <= usize::from(u16::MAX);
    let prefix = if v1 { 10 } else { 12 };
    let unpadded = prefix + dict.len() + 1;
    dict.push_str(&" ".repeat(unpadded.next_multiple_of(64) - unpadded));
    dict.push('\n');
    let mut out = b"\x93NUMPY".to_vec();
    if v1 {
        out.extend_from_slice(&[1, 0]);
        out.extend_from_slice(&(dict.len() as u16).to_le_bytes());
    } else {
        out.extend_from_slice(&[2, 0]);
        out.extend_from_slice(&(dict.len() as u32).to_le_bytes());
    }
    out.extend_from_slice(dict.as_bytes());
    out
}

/// The header and payload bytes of a tensor of a plain numeric dtype (little-endian
/// hosts), written as they are in memory.
fn plain_npy(t: &Tensor) -> Option<(Vec<u8>, &[u8])> {
    if !cfg!(target_endian = "little") {
        return None;
    }
    let (descr, payload): (&str, &[u8]) = match t.data() {
        TensorData::F32(v) => ("<f4", bytemuck::cast_slice(v)),
        TensorData::F64(v) => ("<f8", bytemuck::cast_slice(v)),
        TensorData::I8(v) => ("|i1", bytemuck::cast_slice(v)),
        TensorData::I16(v) => ("<i2", bytemuck::cast_slice(v)),
        TensorData::I32(v) => ("<i4", bytemuck::cast_slice(v)),
        TensorData::I64(v) => ("<i8", bytemuck::cast_slice(v)),
        TensorData::U8(v) => ("|u1", bytemuck::cast_slice(v)),
        TensorData::U16(v) => ("<u2", bytemuck::cast_slice(v)),
        TensorData::U32(v) => ("<u4", bytemuck::cast_slice(v)),
        TensorData::U64(v) => ("<u8", bytemuck::cast_slice(v)),
        _ => return None,
    };
    Some((npy_header(descr, t.shape()), payload))
}

/// A tensor as the bytes of a `.npy` file.
pub fn npy_bytes(t: &Tensor) -> Result<Vec<u8>> {
    if let Some((mut header, payload)) = plain_npy(t) {
        header.extend_from_slice(payload);
        return Ok(header);
    }
    // npyz may seek back to patch the header: a cursor over the buffer allows it.
    let mut w = std::io::Cursor::new(Vec::<u8>::new());
    let shape: Vec<u64> = t.shape().iter().map(|&d| d as u64).collect();
    macro_rules! put {
        ($v:expr) => {{
            let mut wr = npyz::WriteOptions::new()
                .default_dtype()
                .shape(&shape)
                .writer(&mut w)
                .begin_nd()?;
            wr.extend($v.iter().cloned())?;
            wr.finish()?;
        }};
    }
    match t.data() {
        TensorData::F32(v) => put!(v),
        TensorData::F64(v) => put!(v),
        TensorData::F16(v) => put!(v),
        TensorData::BF16(v) => {
            let w32: Vec<f32> = v.iter().map(|x| x.to_f32()).collect();
            put!(w32)
        }
        TensorData::I8(v) => put!(v),
        TensorData::I16(v) => put!(v),
        TensorData::I32(v) => put!(v),
        TensorData::I64(v) => put!(v),
        TensorData::U8(v) => put!(v),
        TensorData::U16(v) => put!(v),
        TensorData::U32(v) => put!(v),
        TensorData::U64(v) => put!(v),
        TensorData::Bool(v) => put!(v),
        TensorData::String(v) => {
            // Fixed-width unicode, like numpy's `<U{n}`.
            let width = v.iter().map(|s| s.chars().count()).max().unwrap_or(0).max(1);
            let dtype = npyz::DType::Plain(
                format!("<U{width}").parse().map_err(|e| TensorFileError(format!("{e:?}")))?,
            );
            let mut wr =
                npyz::WriteOptions::new().dtype(dtype).shape(&shape).writer(&mut w).begin_nd()?;
            for s in v {
                let chars: Vec<char> = s.chars().collect();
                wr.push(&chars)?;
            }
            wr.finish()?;
        }
        TensorData::Table(_) => bail!("a table has no .npy form; it is written as CSV"),
        // numpy has no such types: their values, as bf16's are (f32; sub-byte ints as i8).
        TensorData::Lowp(l, v) if l.is_int() => {
            let wide: Vec<i8> = v.iter().map(|&c| l.to_f64(c) as i8).collect();
            put!(wide)
        }
        TensorData::Lowp(l, v) => {
            let wide: Vec<f32> = v.iter().map(|&c| l.to_f64(c) as f32).collect();
            put!(wide)
        }
    }
    Ok(w.into_inner())
}

/// A one-line summary of a tensor for stdout.
pub fn summary(t: &Tensor) -> String {
    let mut s = format!("{} {:?}", t.dtype(), t.shape());
    if t.dtype().is_numeric() && t.numel() > 0 {
        let (min, max, sum) = min_max_sum(t.data());
        let mean = sum / t.numel() as f64;
        s.push_str(&format!(" min {min:.6} max {max:.6} mean {mean:.6}"));
    }
    let head: Vec<String> = (0..t.numel().min(6))
        .map(|i| match t.data() {
            TensorData::String(v) => format!("{:?}", v[i]),
            TensorData::Bool(v) => v[i].to_string(),
            d if t.dtype().is_float() => format!("{:.6}", d.get_f64(i)),
            d => format!("{}", d.get_f64(i)),
        })
        .collect();
    s.push_str(&format!(" [{}{}]", head.join(", "), if t.numel() > 6 { ", …" } else { "" }));
    s
}

/// Minimum, maximum and sum of a numeric tensor's elements in f64, read in place (a large
/// output is not converted to a second, f64 copy to print three numbers).
fn min_max_sum(d: &TensorData) -> (f64, f64, f64) {
    fn fold(xs: impl Iterator<Item = f64>) -> (f64, f64, f64) {
        xs.fold((f64::INFINITY, f64::NEG_INFINITY, 0.0), |(lo, hi, sum), x| {
            (lo.min(x), hi.max(x), sum + x)
        })
    }
    match d {
        TensorData::F32(v) => fold(v.iter().map(|&x| x as f64)),
        TensorData::F64(v) => fold(v.iter().copied()),
        TensorData::I32(v) => fold(v.iter().map(|&x| x as f64)),
        TensorData::I64(v) => fold(v.iter().map(|&x| x as f64)),
        other => fold((0..other.len()).map(|i| other.get_f64(i))),
    }
}

/// File name for an output: `/` (and other path separators) become `_`.
pub fn output_file_name(name: &str) -> String {
    let cleaned: String =
        name.chars().map(|c| if c == '/' || c == '\\' || c == '\0' { '_' } else { c }).collect();
    if cleaned.is_empty() || cleaned == "." || cleaned == ".." {
        format!("output_{cleaned}")
    } else {
        cleaned
    }
}

/// A tensor the way numpy prints it: nested brackets, rows aligned; large tensors show
/// their first and last 3 entries per axis.
pub fn pretty(t: &Tensor) -> String {
    if let Some(table) = t.data().as_table() {
        return table.to_string();
    }
    let shape = t.shape().to_vec();
    let vals: Vec<String> = match t.data() {
        TensorData::Bool(v) => {
            v.iter().map(|b| if *b { "True".into() } else { "False".into() }).collect()
        }
        TensorData::String(v) => v.iter().map(|s| format!("{s:?}")).collect(),
        d if t.dtype().is_float() => (0..d.len()).map(|i| format_float(d.get_f64(i))).collect(),
        d => (0..d.len()).map(|i| format!("{}", d.get_f64(i) as i64)).collect(),
    };
    if shape.is_empty() {
        return vals.first().cloned().unwrap_or_default();
    }
    let width = vals.iter().map(|v| v.chars().count()).max().unwrap_or(1);
    let mut out = String::new();
    fn rec(
        out: &mut String,
        vals: &[String],
        shape: &[usize],
        offset: usize,
        stride: usize,
        width: usize,
        indent: usize,
    ) {
        out.push('[');
        let n = shape[0];
        let inner: usize = shape[1..].iter().product();
        let show: Vec<usize> =
            if n > 6 { (0..3).chain(n - 3..n).collect() } else { (0..n).collect() };
        for (k, &i) in show.iter().enumerate() {
            if k > 0 {
                if shape.len() > 1 {
                    out.push_str(&"\n".repeat(shape.len() - 1));
                    out.push_str(&" ".repeat(indent + 1));
                } else {
                    out.push(' ');
                }
            }
            if n > 6 && k == 3 {
                out.push_str("...");
                if shape.len() > 1 {
                    out.push('\n');
                    out.push_str(&" ".repeat(indent + 1));
                } else {
                    out.push(' ');
                }
            }
            if shape.len() == 1 {
                out.push_str(&format!("{:>width$}", vals[offset + i * stride]));
            } else {
                rec(out, vals, &shape[1..], offset + i * inner, stride, width, indent + 1);
            }
        }
        out.push(']');
    }
    rec(&mut out, &vals, &shape, 0, 1, width, 0);
    out
}

fn format_float(v: f64) -> String {
    if v.is_nan() {
        return "nan".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "inf".into() } else { "-inf".into() };
    }
    if v == v.trunc() && v.abs() < 1e16 {
        return format!("{v:.1}");
    }
    let s = format!("{v:.6}");
    let s = s.trim_end_matches('0');
    // 0.9999999 rounds to "1.": keep a digit after the point, as numpy does.
    if s.ends_with('.') { format!("{s}0") } else { s.to_string() }
}

/// Writes a table as CSV: a header row, RFC 4180 quoting where a field needs it, missing
/// values empty, booleans `True`/`False` and floats in shortest round-trip form, as pandas'
/// `to_csv` writes them. A table whose first column is its row labels (`stats`) writes that
/// column's header empty, as pandas writes an unnamed index, so it reads back as labels.
pub fn write_csv(path: &Path, t: &xpu_ir::Table) -> Result<()> {
    let bytes = csv_bytes(t)?;
    std::fs::write(path, bytes)
        .map_err(|e| TensorFileError(format!("cannot write {}: {e}", path.display())))
}

/// A table as the bytes of a CSV file (see [`write_csv`]).
pub fn csv_bytes(t: &xpu_ir::Table) -> Result<Vec<u8>> {
    use xpu_ir::ColumnData;
    let mut w = csv::Writer::from_writer(Vec::new());
    w.write_record(
        t.columns.iter().enumerate().map(|(i, c)| if i == 0 && t.index { "" } else { &c.name }),
    )?;
    for r in 0..t.rows() {
        w.write_record(t.columns.iter().map(|c| {
            match &c.data {
                ColumnData::Bool(v) => v[r].map(|b| if b { "True".into() } else { "False".into() }),
                ColumnData::I64(v) => v[r].map(|x| x.to_string()),
                ColumnData::F64(v) => v[r].map(|x| format!("{x:?}")),
                ColumnData::String(v) => v[r].clone(),
            }
            .unwrap_or_default()
        }))?;
    }
    w.into_inner().map_err(|e| TensorFileError(e.to_string()))
}

/// A value as the bytes of its file and the file's extension: a table as CSV, a tensor as
/// `.npy` (the forms `read_bytes` takes back).
pub fn value_file(t: &Tensor) -> Result<(Vec<u8>, &'static str)> {
    match t.data().as_table() {
        Some(table) => Ok((csv_bytes(table)?, "csv")),
        None => Ok((npy_bytes(t)?, "npy")),
    }
}

/// A table as the value a program sees (a tensor of shape `[]` holding it).
pub fn table_value(table: xpu_ir::Table) -> Tensor {
    Tensor::scalar(table)
}

/// Reads a table from CSV (one written by [`csv_bytes`], or by pandas, R, Excel): a column
/// whose cells all read as integers is i64, as numbers f64 (`inf`, `nan` and exponents
/// included), as `True`/`False` bool, otherwise string; an empty cell or one of pandas'
/// missing-value markers (`NA`, `nan`, `NULL`, …) is missing. Rows
/// shorter than the header are refused with their line.
pub fn table_from_csv(bytes: &[u8]) -> Result<xpu_ir::Table> {
    use xpu_ir::{Column, ColumnData};
    let mut r = csv::ReaderBuilder::new().from_reader(bytes);
    let names: Vec<String> = r.headers()?.iter().map(str::to_string).collect();
    if names.is_empty() {
        // pandas too: "No columns to parse from file".
        bail!("no columns: the file is empty (a CSV table starts with a header row)");
    }
    for (i, n) in names.iter().enumerate() {
        if names[..i].contains(n) {
            bail!("column {n:?} appears twice in the header");
        }
    }
    let mut cells: Vec<Vec<Option<String>>> = vec![Vec::new(); names.len()];
    for rec in r.records() {
        let rec = rec?;
        for (i, col) in cells.iter_mut().enumerate() {
            let cell = rec.get(i).filter(|c| !xpu_ir::table::PANDAS_NA_VALUES.contains(c));
            col.push(cell.map(str::to_string));
        }
    }
    let columns = names
        .into_iter()
        .zip(cells)
        .map(|(name, col)| {
            let all = |ok: &dyn Fn(&str) -> bool| col.iter().flatten().all(|c| ok(c));
            let data = if all(&|c| c.parse::<i64>().is_ok()) {
                ColumnData::I64(
                    col.iter().map(|c| c.as_ref().and_then(|c| c.parse().ok())).collect(),
                )
            } else if all(&|c| c.parse::<f64>().is_ok()) {
                ColumnData::F64(
                    col.iter().map(|c| c.as_ref().and_then(|c| c.parse().ok())).collect(),
                )
            } else if all(&|c| bool_cell(c).is_some()) {
                ColumnData::Bool(col.iter().map(|c| c.as_deref().and_then(bool_cell)).collect())
            } else {
                ColumnData::String(col)
            };
            Column { name, data }
        })
        .collect();
    let mut table = xpu_ir::Table::new(columns);
    // An empty first header is an index (pandas' `to_csv` of row labels; see `csv_bytes`).
    table.index = table.columns.first().is_some_and(|c| c.name.is_empty());
    Ok(table)
}

/// A boolean cell as pandas (`True`), R and Excel (`TRUE`) or JSON (`true`) write it.
fn bool_cell(c: &str) -> Option<bool> {
    match c {
        "True" | "TRUE" | "true" => Some(true),
        "False" | "FALSE" | "false" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn tables_read_back_from_csv_with_their_types() {
        use xpu_ir::{Column, ColumnData, Table};
        let t = Table::new(vec![
            Column { name: "n".into(), data: ColumnData::I64(vec![Some(1), None, Some(-3)]) },
            Column { name: "x".into(), data: ColumnData::F64(vec![Some(1.0), Some(2.5), None]) },
            Column {
                name: "b".into(),
                data: ColumnData::Bool(vec![Some(true), None, Some(false)]),
            },
            Column {
                name: "s".into(),
                data: ColumnData::String(vec![Some("a,\"b\"".into()), Some("7x".into()), None]),
            },
        ]);
        let back = super::table_from_csv(&super::csv_bytes(&t).unwrap()).unwrap();
        assert_eq!(back, t);
        // Row labels (describe's statistic names) come back as labels, printed as a local
        // run prints them.
        let mut stats = Table::new(vec![
            Column {
                name: "statistic".into(),
                data: ColumnData::String(vec![Some("count".into()), Some("mean".into())]),
            },
            Column { name: "x".into(), data: ColumnData::F64(vec![Some(3.0), Some(1.5)]) },
        ]);
        stats.index = true;
        let bytes = super::csv_bytes(&stats).unwrap();
        assert!(bytes.starts_with(b",x\n"), "{}", String::from_utf8_lossy(&bytes));
        let back = super::table_from_csv(&bytes).unwrap();
        assert!(back.index);
        assert_eq!(back.to_string(), stats.to_string());
    }

    use super::*;

    fn sample_npy() -> Vec<u8> {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.npy");
        write_npy(
            &p,
            &Tensor::from_vec(vec![2, 3], vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap(),
        )
        .unwrap();
        std::fs::read(p).unwrap()
    }

    #[test]
    fn npy_round_trips_every_dtype() {
        let dir = tempfile::tempdir().unwrap();
        let cases = vec![
            Tensor::from_vec(vec![2], vec![1.5f64, -2.0]).unwrap(),
            Tensor::from_vec(
                vec![3],
                vec![half::f16::from_f32(0.5), half::f16::ONE, half::f16::ZERO],
            )
            .unwrap(),
            Tensor::from_vec(vec![2, 1], vec![-3i8, 4]).unwrap(),
            Tensor::from_vec(vec![2], vec![7u16, 9]).unwrap(),
            Tensor::from_vec(vec![], vec![42i64]).unwrap(),
            Tensor::from_vec(vec![3], vec![true, false, true]).unwrap(),
            Tensor::from_vec(vec![2], vec!["héllo".to_string(), "x".to_string()]).unwrap(),
            Tensor::from_vec(vec![0, 4], Vec::<f32>::new()).unwrap(),
        ];
        for (i, t) in cases.into_iter().enumerate() {
            let p = dir.path().join(format!("{i}.npy"));
            write_npy(&p, &t).unwrap();
            let (_, back) = read(&p).unwrap();
            assert_eq!(back, t);
        }
    }

    /// A `.npy` file read from its header straight into the elements gives what reading
    /// the whole file gives — the same tensor, or the same error — for every plain dtype, a
    /// large array (huge-page advice), and the file cut short or damaged anywhere.
    #[test]
    fn npy_files_read_in_place_as_the_whole_file_reader_reads_them() {
        let dir = tempfile::tempdir().unwrap();
        let big: Vec<f32> = (0..(5 << 20) / 4).map(|i| i as f32 * 0.5).collect();
        let tensors = vec![
            Tensor::from_vec(vec![1280, 1024], big).unwrap(),
            Tensor::from_vec(vec![2, 3], vec![1.5f64, -2.0, 0.0, 1e300, -0.0, 7.0]).unwrap(),
            Tensor::from_vec(vec![3], vec![-3i8, 4, 127]).unwrap(),
            Tensor::from_vec(vec![2], vec![7u16, 9]).unwrap(),
            Tensor::from_vec(vec![2], vec![-7i32, 9]).unwrap(),
            Tensor::from_vec(vec![], vec![42i64]).unwrap(),
            Tensor::from_vec(vec![2], vec![1u64 << 40, 3]).unwrap(),
            Tensor::from_vec(vec![3], vec![true, false, true]).unwrap(),
            Tensor::from_vec(vec![0, 4], Vec::<f32>::new()).unwrap(),
        ];
        let same = |p: &std::path::Path| {
            let bytes = std::fs::read(p).unwrap();
            let whole = read_bytes(&p.display().to_string(), "npy", &bytes);
            let in_place = read(p);
            assert_eq!(format!("{in_place:?}"), format!("{whole:?}"), "{}", p.display());
            in_place.is_ok()
        };
        for (i, t) in tensors.iter().enumerate() {
            let p = dir.path().join(format!("{i}.npy"));
            write_npy(&p, t).unwrap();
            assert!(same(&p));
            assert_eq!(&read(&p).unwrap().1, t);
            let bytes = std::fs::read(&p).unwrap();
            let damaged = dir.path().join(format!("{i}-damaged.npy"));
            // Cut short at every length through the header and a few into the payload.
            for cut in (0..bytes.len().min(200)).chain([bytes.len() - 1]) {
                std::fs::write(&damaged, &bytes[..cut]).unwrap();
                same(&damaged);
            }
            // Header bytes flipped: version, length, dict contents.
            for at in [6, 7, 8, 9, 11, 20, 30, 40, 60] {
                let mut b = bytes.clone();
                if at < b.len() {
                    b[at] ^= 0x5a;
                }
                std::fs::write(&damaged, &b).unwrap();
                same(&damaged);
            }
        }
        // Fortran order and big-endian: read the slow way, or refused, as before.
        let t = Tensor::from_vec(vec![2, 2], vec![1.0f32, 2.0, 3.0, 4.0]).unwrap();
        let p = dir.path().join("f.npy");
        write_npy(&p, &t).unwrap();
        let b = std::fs::read(&p).unwrap();
        let text = String::from_utf8_lossy(&b).into_owned();
        for (from, to) in [("'fortran_order': False", "'fortran_order': True "), ("<f4", ">f4")] {
            std::fs::write(&p, text.replace(from, to).into_bytes()).unwrap();
            same(&p);
        }
    }

    /// The fast paths (payload copied as is) agree with npyz both ways: files npyz writes
    /// read back equal, and the headers written here are numpy's, 64-byte aligned.
    #[test]
    fn plain_npy_payloads_match_npyz() {
        let values: Vec<f32> = (0..1000).map(|i| i as f32 * 0.37 - 50.0).collect();
        let mut w = std::io::Cursor::new(Vec::<u8>::new());
        let mut wr = npyz::WriteOptions::new()
            .default_dtype()
            .shape(&[10, 100])
            .writer(&mut w)
            .begin_nd()
            .unwrap();
        wr.extend(values.iter().cloned()).unwrap();
        wr.finish().unwrap();
        let t = read_npy(&w.into_inner()).unwrap();
        assert_eq!(t.shape(), [10, 100]);
        assert_eq!(t.as_slice::<f32>().unwrap(), values.as_slice());
        for shape in [vec![], vec![7], vec![2, 3, 4]] {
            let n: usize = shape.iter().product();
            let t = Tensor::from_vec(shape.clone(), (0..n as i32).collect()).unwrap();
            let bytes = npy_bytes(&t).unwrap();
            let npy = npyz::NpyFile::new(&bytes[..]).unwrap();
            let dims: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
            assert_eq!(npy.shape(), dims.as_slice());
            assert_eq!(npy.into_vec::<i32>().unwrap(), (0..n as i32).collect::<Vec<_>>());
            let header = 10 + u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
            assert_eq!(header % 64, 0, "{:?}", String::from_utf8_lossy(&bytes[..header]));
        }
        // A header past 64 KiB takes format version 2 (a 4-byte length), which npyz reads.
        let dims = vec![1usize; 30_000];
        let bytes = npy_bytes(&Tensor::from_vec(dims.clone(), vec![7i32]).unwrap()).unwrap();
        assert_eq!(bytes[6], 2);
        let header = 12 + u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize;
        assert_eq!(header % 64, 0);
        let npy = npyz::NpyFile::new(&bytes[..]).unwrap();
        assert_eq!(npy.shape().len(), dims.len());
        assert_eq!(npy.into_vec::<i32>().unwrap(), [7]);
    }

    #[test]
    fn garbage_npy_is_an_error_not_a_panic() {
        let good = sample_npy();
        for end in 0..good.len() {
            let _ = read_npy(&good[..end]);
        }
        for i in 0..good.len() {
            for b in [0u8, 0xFF, b'(', b',', b'\'', b'9', b'U'] {
                let mut v = good.clone();
                v[i] = b;
                let _ = read_npy(&v);
            }
        }
        let mut s = 0x1234_5678_9ABC_DEF1u64;
        for n in 0..2000 {
            let mut v = b"\x93NUMPY\x01\x00".to_vec();
            v.extend((0..n % 120).map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                b"{}'descr':<f4 fortran_order False shape (,3)\n 0123456789U"[(s % 56) as usize]
            }));
            let _ = read_npy(&v);
        }
        assert!(read_npy(b"not numpy").is_err());
        let mut huge = b"\x93NUMPY\x01\x00".to_vec();
        let header = "{'descr': '<f4', 'fortran_order': False, 'shape': (4000000000, 4000000000), }          \n";
        huge.extend_from_slice(&(header.len() as u16).to_le_bytes());
        huge.extend_from_slice(header.as_bytes());
        let err = read_npy(&huge).unwrap_err().to_string();
        assert!(err.contains("needs more data than the file"), "{err}");
    }

    /// A header as found by mutation (a valid start, then ~1,500 `[`) hung npyz's parser for
    /// minutes; deep nesting and oversized headers are now refused in one linear pass.
    #[test]
    fn csv_inputs_are_tables_and_hostile_ones_are_refused_with_their_place() {
        let read = |bytes: &[u8]| super::read_bytes("t.csv", "csv", bytes).map(|(_, t)| t);
        let t = read(b"a,b,c,d\n1,2.5,TRUE,x\nNA,inf,false,\n").unwrap();
        let table = t.data().as_table().unwrap();
        let types: Vec<&str> = table.columns.iter().map(|c| c.data.type_name()).collect();
        assert_eq!(types, ["i64", "f64", "bool", "string"]);
        assert_eq!(table.rows(), 2);
        let long_line = format!("a\n{}\n", "7".repeat(4 << 20));
        // (bytes, Err(text the error holds) or Ok(the first column's type)).
        let cases: Vec<(Vec<u8>, std::result::Result<&str, &str>)> = vec![
            (b"a,b\n1,2\n3\n".to_vec(), Err("line: 3")),
            (b"a,a\n1,2\n".to_vec(), Err("column \"a\" appears twice")),
            (b"a\n\xff\xfe\n".to_vec(), Err("UTF-8")),
            // No header, no columns (pandas: "No columns to parse from file"); found by
            // fuzzing, as it wrote back as one unnamed column.
            (Vec::new(), Err("no columns")),
            // 100,000 quotes are one quoted header cell: valid, and read in one pass.
            (format!("{}\n1\n", "\"".repeat(100_000)).into_bytes(), Ok("i64")),
            // A 4 MiB number overflows i64: f64 (infinite), as pandas reads it.
            (long_line.into_bytes(), Ok("f64")),
        ];
        for (bytes, want) in cases {
            let started = std::time::Instant::now();
            match (read(&bytes), want) {
                (Err(e), Err(want)) => {
                    let e = e.to_string();
                    assert!(e.contains(want) && e.contains("t.csv"), "{e}");
                }
                (Ok(t), Ok(want)) => {
                    assert_eq!(t.data().as_table().unwrap().columns[0].data.type_name(), want)
                }
                (got, want) => panic!("{want:?}: got {:?}", got.map(|t| t.ty())),
            }
            assert!(started.elapsed() < std::time::Duration::from_secs(10));
        }
    }

    #[test]
    fn hostile_npy_headers_are_refused_promptly() {
        let npy = |header: &str, version: u8| {
            let mut v = b"\x93NUMPY".to_vec();
            v.extend_from_slice(&[version, 0]);
            if version == 1 {
                v.extend_from_slice(&(header.len() as u16).to_le_bytes());
            } else {
                v.extend_from_slice(&(header.len() as u32).to_le_bytes());
            }
            v.extend_from_slice(header.as_bytes());
            v
        };
        let start = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 8),";
        let cases = [
            (npy(&format!("{start}{}", "[".repeat(1500)), 1), "nests brackets more than 8 deep"),
            (npy(&format!("{start}{}", "(".repeat(100_000)), 3), "at most 10000 are accepted"),
            (npy(&"{".repeat(9000), 1), "nests brackets more than 8 deep"),
            // Brackets inside a string are text, not nesting: refused later, by npyz.
            (npy(&format!("{start} 'x': '{}' }}", "[".repeat(5000)), 1), ""),
            (npy(&" ".repeat(9999), 2), ""),
        ];
        for (bytes, want) in cases {
            let started = std::time::Instant::now();
            let err = read_npy(&bytes).unwrap_err().to_string();
            assert!(err.contains(want), "{err}");
            // A hang detector, not a speed bar: the old parser took minutes.
            assert!(started.elapsed() < std::time::Duration::from_secs(10), "{err}");
        }
        // Through the file reader, the error names the file.
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("deep.npy");
        std::fs::write(&p, npy(&format!("{start}{}", "[".repeat(1500)), 1)).unwrap();
        let err = read(&p).unwrap_err().to_string();
        assert!(err.contains("deep.npy: not a valid .npy file"), "{err}");
    }
}
