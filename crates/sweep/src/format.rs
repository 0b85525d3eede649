//! The output's formats: Parquet, CSV and JSON, each with the columns
//! `workload, setting, machine, snapshot, line, counter, value` (`line`
//! empty or null at `end`), and each read back to resume a sweep.
//!
//! Parquet is written through the `parquet` crate's own column writers (no
//! Arrow): one row group per million rows, dictionary-encoded, not
//! compressed (a compression codec is a feature of the crate, and a C
//! library to build). CSV follows RFC 4180 (a field holding `,`, `"` or a
//! line break is quoted). JSON is an array of row objects, one per line.

use crate::cell::{Row, RowRef};
use anyhow::{bail, Context, Result};
use parquet::data_type::{ByteArray, ByteArrayType, Int64Type};
use parquet::file::properties::WriterProperties;
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::file::writer::SerializedFileWriter;
use parquet::record::Field;
use parquet::schema::parser::parse_message_type;
use std::borrow::Cow;
use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::Path;
use std::sync::Arc;

/// The columns, in order.
pub const COLUMNS: [&str; 7] = [
    "workload", "setting", "machine", "snapshot", "line", "counter", "value",
];

const SCHEMA: &str = "message sweep {
  required binary workload (STRING);
  required binary setting (STRING);
  required binary machine (STRING);
  required binary snapshot (STRING);
  optional int64 line;
  required binary counter (STRING);
  required int64 value;
}";

/// Rows per Parquet row group.
const ROW_GROUP: usize = 1 << 20;
/// Rows per call of a column writer (a multiple of its 1024-value
/// mini-batches, so that its pages end where they would for the whole).
const BATCH: usize = 1 << 13;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Parquet,
    Csv,
    Json,
}

impl Format {
    /// `parquet`, `csv` or `json`.
    pub fn parse(name: &str) -> Result<Format> {
        Ok(match name {
            "parquet" => Format::Parquet,
            "csv" => Format::Csv,
            "json" => Format::Json,
            _ => bail!("--format {name}: the formats are parquet, csv and json"),
        })
    }

    /// The format `given`, else the one `path`'s extension names.
    pub fn of(path: &Path, given: Option<&str>) -> Result<Format> {
        if let Some(name) = given {
            return Format::parse(name);
        }
        match path.extension().and_then(|e| e.to_str()) {
            Some("parquet") => Ok(Format::Parquet),
            Some("csv") => Ok(Format::Csv),
            Some("json") => Ok(Format::Json),
            _ => bail!(
                "{}: the output's extension names no format (.parquet, .csv, .json); \
                 give --format",
                path.display()
            ),
        }
    }
}

/// Writes `rows` to `out` in `format`.
pub fn write(format: Format, rows: &[RowRef], out: File) -> Result<()> {
    match format {
        Format::Parquet => write_parquet(rows, out),
        Format::Csv => write_csv(rows, BufWriter::new(out)),
        Format::Json => write_json(rows, BufWriter::new(out)),
    }
}

/// Reads back a file [`write`] wrote.
pub fn read(format: Format, path: &Path) -> Result<Vec<Row>> {
    let file = File::open(path)?;
    match format {
        Format::Parquet => read_parquet(file),
        Format::Csv => read_csv(BufReader::new(file)),
        Format::Json => Ok(serde_json::from_reader(BufReader::new(file))?),
    }
}

/// A batch of rows' texts of one column into `out`: each distinct string
/// made a `ByteArray` once (in `made`, kept from batch to batch) and shared
/// (a `ByteArray` clone counts a reference; a column repeats few strings
/// many times).
fn bytes<'a>(
    rows: &[RowRef<'a>],
    f: impl Fn(&RowRef<'a>) -> &'a str,
    made: &mut HashMap<&'a str, ByteArray>,
    out: &mut Vec<ByteArray>,
) {
    out.clear();
    out.extend(rows.iter().map(|r| {
        let s = f(r);
        made.entry(s).or_insert_with(|| ByteArray::from(s)).clone()
    }));
}

fn write_parquet(rows: &[RowRef], out: File) -> Result<()> {
    let schema = Arc::new(parse_message_type(SCHEMA)?);
    let props = WriterProperties::builder()
        .set_created_by("hugelab sweep".to_string())
        .build();
    let mut writer = SerializedFileWriter::new(out, schema, Arc::new(props))?;
    let (mut ints, mut levels, mut texts) = (Vec::new(), Vec::new(), Vec::new());
    let mut made = HashMap::new();
    for group in rows.chunks(ROW_GROUP) {
        let mut rg = writer.next_row_group()?;
        let mut index = 0;
        while let Some(mut column) = rg.next_column()? {
            // A batch at a time, into buffers used again: a row group's
            // column whole would be tens of MB of fresh memory.
            for batch in group.chunks(BATCH) {
                match COLUMNS[index] {
                    "line" => {
                        ints.clear();
                        ints.extend(batch.iter().filter_map(|r| r.line).map(i64::from));
                        levels.clear();
                        levels.extend(batch.iter().map(|r| i16::from(r.line.is_some())));
                        column
                            .typed::<Int64Type>()
                            .write_batch(&ints, Some(&levels), None)?;
                    }
                    "value" => {
                        ints.clear();
                        ints.extend(batch.iter().map(|r| r.value));
                        column.typed::<Int64Type>().write_batch(&ints, None, None)?;
                    }
                    name => {
                        bytes(batch, |r| text_column(r, name), &mut made, &mut texts);
                        column
                            .typed::<ByteArrayType>()
                            .write_batch(&texts, None, None)?;
                    }
                }
            }
            column.close()?;
            index += 1;
        }
        rg.close()?;
    }
    writer.close()?;
    Ok(())
}

/// A row's text column by name.
fn text_column<'a>(r: &RowRef<'a>, name: &str) -> &'a str {
    match name {
        "workload" => r.workload,
        "setting" => r.setting,
        "machine" => r.machine,
        "snapshot" => r.snapshot,
        _ => r.counter,
    }
}

fn read_parquet(file: File) -> Result<Vec<Row>> {
    let reader = SerializedFileReader::new(file)?;
    let mut rows = Vec::new();
    for row in reader.get_row_iter(None)? {
        let row = row?;
        let fields: Vec<&Field> = row.get_column_iter().map(|(_, f)| f).collect();
        let text = |i: usize| match fields.get(i) {
            Some(Field::Str(s)) => Ok(s.clone()),
            _ => bail!("column {} is not text", COLUMNS[i]),
        };
        let line = match fields.get(4) {
            Some(Field::Null) => None,
            Some(Field::Long(n)) => Some(u32::try_from(*n)?),
            _ => bail!("column line is not a line number"),
        };
        let Some(Field::Long(value)) = fields.get(6) else {
            bail!("column value is not a number");
        };
        rows.push(Row {
            workload: text(0)?,
            setting: text(1)?,
            machine: text(2)?,
            snapshot: text(3)?,
            line,
            counter: text(5)?,
            value: *value,
        });
    }
    Ok(rows)
}

/// A CSV field: quoted when it holds `,`, `"` or a line break.
fn csv_field(s: &str) -> Cow<'_, str> {
    if s.contains([',', '"', '\n', '\r']) {
        Cow::Owned(format!("\"{}\"", s.replace('"', "\"\"")))
    } else {
        Cow::Borrowed(s)
    }
}

fn write_csv(rows: &[RowRef], mut out: impl Write) -> Result<()> {
    writeln!(out, "{}", COLUMNS.join(","))?;
    for r in rows {
        let line = r.line.map_or(String::new(), |l| l.to_string());
        writeln!(
            out,
            "{},{},{},{},{line},{},{}",
            csv_field(r.workload),
            csv_field(r.setting),
            csv_field(r.machine),
            csv_field(r.snapshot),
            csv_field(r.counter),
            r.value
        )?;
    }
    out.flush()?;
    Ok(())
}

/// The fields of a CSV record that starts on `first` (reading more lines
/// while a quoted field is open).
fn csv_record(
    first: String,
    lines: &mut impl Iterator<Item = std::io::Result<String>>,
) -> Result<Vec<String>> {
    let mut fields = Vec::new();
    let mut field = String::new();
    let (mut quoted, mut text) = (false, first);
    loop {
        let mut chars = text.chars().peekable();
        while let Some(c) = chars.next() {
            match (quoted, c) {
                (true, '"') if chars.peek() == Some(&'"') => {
                    chars.next();
                    field.push('"');
                }
                (true, '"') => quoted = false,
                (true, c) => field.push(c),
                (false, '"') => quoted = true,
                (false, ',') => fields.push(std::mem::take(&mut field)),
                (false, c) => field.push(c),
            }
        }
        if !quoted {
            fields.push(field);
            return Ok(fields);
        }
        field.push('\n');
        text = lines.next().context("a quoted field runs past the end")??;
    }
}

fn read_csv(input: impl BufRead) -> Result<Vec<Row>> {
    let mut lines = input.lines();
    let header = lines.next().context("no header line")??;
    if header != COLUMNS.join(",") {
        bail!("its header is not {}", COLUMNS.join(","));
    }
    let mut rows = Vec::new();
    while let Some(first) = lines.next() {
        let f = csv_record(first?, &mut lines)?;
        let [workload, setting, machine, snapshot, line, counter, value] =
            <[String; 7]>::try_from(f)
                .map_err(|f| anyhow::anyhow!("a record has {} fields, not 7", f.len()))?;
        rows.push(Row {
            workload,
            setting,
            machine,
            snapshot,
            line: if line.is_empty() {
                None
            } else {
                Some(line.parse()?)
            },
            counter,
            value: value.parse()?,
        });
    }
    Ok(rows)
}

fn write_json(rows: &[RowRef], mut out: impl Write) -> Result<()> {
    out.write_all(b"[")?;
    for (i, r) in rows.iter().enumerate() {
        out.write_all(if i == 0 { b"\n" } else { b",\n" })?;
        serde_json::to_writer(&mut out, r)?;
    }
    out.write_all(b"\n]\n")?;
    out.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows() -> Vec<Row> {
        let row = |machine: &str, line, counter: &str, value| Row {
            workload: "a \"b\".hlw".into(),
            setting: "PMD".into(),
            machine: machine.into(),
            snapshot: "s".into(),
            line,
            counter: counter.into(),
            value,
        };
        vec![
            row(
                "memory=4G,fragment=10% pattern=clustered",
                Some(3),
                "vmstat.pgfault",
                7,
            ),
            row("own", None, "meminfo.AnonPages", -1),
            row("two\nlines", None, "x", i64::MAX),
        ]
    }

    #[test]
    fn each_format_reads_back_what_it_wrote() {
        let dir = std::env::temp_dir().join(format!("hugelab-sweep-format-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for format in [Format::Parquet, Format::Csv, Format::Json] {
            let path = dir.join(format!("{format:?}"));
            let owned = rows();
            let refs: Vec<RowRef> = owned.iter().map(Row::as_ref).collect();
            write(format, &refs, File::create(&path).unwrap()).unwrap();
            assert_eq!(read(format, &path).unwrap(), rows(), "{format:?}");
        }
        let csv = std::fs::read_to_string(dir.join("Csv")).unwrap();
        assert!(csv.starts_with(
            "workload,setting,machine,snapshot,line,counter,value\n\
             \"a \"\"b\"\".hlw\",PMD,\"memory=4G,fragment=10% pattern=clustered\",s,3,vmstat.pgfault,7\n"
        ), "{csv}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_format_comes_from_the_extension_unless_given() {
        assert_eq!(
            Format::of(Path::new("a.parquet"), None).unwrap(),
            Format::Parquet
        );
        assert_eq!(
            Format::of(Path::new("a.csv"), Some("json")).unwrap(),
            Format::Json
        );
        let err = Format::of(Path::new("a.txt"), None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("give --format"), "{err}");
    }
}
