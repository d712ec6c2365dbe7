//! Tables out through the Arrow C stream interface: a MiniLang table becomes an
//! `ArrowTable`, which any consumer of Arrow's PyCapsule protocol reads without a copy of
//! its own (`pyarrow.table(t)`, `polars.DataFrame(t)`, pandas through pyarrow) and which
//! also gives its columns as numpy arrays for Python without pyarrow.

use std::sync::Arc;

use arrow::array::{
    ArrayRef, BooleanArray, Float64Array, Int64Array, LargeStringArray, RecordBatch,
    RecordBatchIterator,
};
use arrow::datatypes::{DataType, Field, Schema};
use arrow::ffi::FFI_ArrowSchema;
use arrow::ffi_stream::FFI_ArrowArrayStream;
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyDict};
use xpu_ir::table::{ColumnData, Table};

/// A table a program printed: Arrow's stream protocol (`__arrow_c_stream__`,
/// `__arrow_c_schema__`) and its columns as numpy arrays (`columns()`).
#[pyclass(module = "xpu._xpu", frozen)]
pub struct ArrowTable {
    table: Table,
    batch: RecordBatch,
}

impl ArrowTable {
    pub fn new(table: Table) -> PyResult<ArrowTable> {
        let batch = record_batch(&table)
            .map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))?;
        Ok(ArrowTable { table, batch })
    }
}

#[pymethods]
impl ArrowTable {
    /// The table as an Arrow C stream (one record batch) in a capsule named
    /// `arrow_array_stream`. A requested schema is not honoured: the consumer casts.
    #[pyo3(signature = (requested_schema = None))]
    fn __arrow_c_stream__<'py>(
        &self,
        py: Python<'py>,
        requested_schema: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        let _ = requested_schema;
        let reader = RecordBatchIterator::new([Ok(self.batch.clone())], self.batch.schema());
        let stream = FFI_ArrowArrayStream::new(Box::new(reader));
        // The consumer moves the stream out (leaving its release empty); the capsule drops
        // what is left, releasing a stream nobody took.
        PyCapsule::new_with_value(py, stream, c"arrow_array_stream")
    }

    /// The table's schema as an Arrow C schema in a capsule named `arrow_schema`.
    fn __arrow_c_schema__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyCapsule>> {
        let schema = FFI_ArrowSchema::try_from(self.batch.schema().as_ref())
            .map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))?;
        PyCapsule::new_with_value(py, schema, c"arrow_schema")
    }

    /// The columns as numpy arrays (see `arrays::table_columns`), in order.
    fn columns<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        crate::arrays::table_columns(py, &self.table)
    }

    #[getter]
    fn num_rows(&self) -> usize {
        self.batch.num_rows()
    }

    #[getter]
    fn column_names(&self) -> Vec<String> {
        self.table.columns.iter().map(|c| c.name.clone()).collect()
    }

    fn __repr__(&self) -> String {
        format!(
            "<xpu.ArrowTable {} rows × {} columns: {}>",
            self.batch.num_rows(),
            self.table.columns.len(),
            self.column_names().join(", ")
        )
    }
}

/// The table as one Arrow record batch: float64, int64, bool and large-utf8 columns, nullable,
/// missing values as nulls.
fn record_batch(table: &Table) -> Result<RecordBatch, arrow::error::ArrowError> {
    let mut fields = Vec::with_capacity(table.columns.len());
    let mut arrays: Vec<ArrayRef> = Vec::with_capacity(table.columns.len());
    for column in &table.columns {
        let (dtype, array): (DataType, ArrayRef) = match &column.data {
            ColumnData::F64(v) => (DataType::Float64, Arc::new(Float64Array::from(v.clone()))),
            ColumnData::I64(v) => (DataType::Int64, Arc::new(Int64Array::from(v.clone()))),
            ColumnData::Bool(v) => (DataType::Boolean, Arc::new(BooleanArray::from(v.clone()))),
            ColumnData::String(v) => {
                // 64-bit offsets: a column of more than 2 GiB of text is still one array.
                let strings = v.iter().map(Option::as_deref).collect::<LargeStringArray>();
                (DataType::LargeUtf8, Arc::new(strings))
            }
        };
        fields.push(Field::new(&column.name, dtype, true));
        arrays.push(array);
    }
    let schema = Arc::new(Schema::new(fields));
    let rows = table.columns.first().map_or(0, |c| c.data.len());
    RecordBatch::try_new_with_options(
        schema,
        arrays,
        &arrow::array::RecordBatchOptions::new().with_row_count(Some(rows)),
    )
}
