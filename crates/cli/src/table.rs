//! Plain-text tables: a header row, then rows, columns padded to fit.

/// `n` and the noun, singular for one: `plural(2, "THP", "THPs")` is "2 THPs".
pub fn plural(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// Renders rows as a table with `|` separators, the first column left-aligned
/// and the others right-aligned (they hold numbers).
pub fn render(header: &[String], rows: &[Vec<String>]) -> String {
    render_aligned(header, rows, 1)
}

/// The same, every column left-aligned (they hold words).
pub fn render_text(header: &[String], rows: &[Vec<String>]) -> String {
    render_aligned(header, rows, header.len())
}

/// Columns before `left` are left-aligned, the others right-aligned.
pub fn render_aligned(header: &[String], rows: &[Vec<String>], left: usize) -> String {
    let ncols = header.len();
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate().take(ncols) {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let line = |cells: &[String]| {
        let mut out = String::from("|");
        for (i, w) in widths.iter().enumerate() {
            let cell = cells.get(i).map_or("", String::as_str);
            if i < left {
                out.push_str(&format!(" {cell:<w$} |"));
            } else {
                out.push_str(&format!(" {cell:>w$} |"));
            }
        }
        out.push('\n');
        out
    };
    let mut out = line(header);
    out.push('|');
    for (i, w) in widths.iter().enumerate() {
        out.push_str(&if i < left {
            format!(":{}|", "-".repeat(w + 1))
        } else {
            format!("{}:|", "-".repeat(w + 1))
        });
    }
    out.push('\n');
    for row in rows {
        out.push_str(&line(row));
    }
    out
}

/// The cells of every row of the rendered tables in `text` (tests read
/// tables back with it).
#[cfg(test)]
pub fn all_row_cells(text: &str) -> impl Iterator<Item = Vec<String>> + '_ {
    text.lines().filter(|l| l.starts_with('|')).map(|l| {
        l.trim_matches('|')
            .split('|')
            .map(|c| c.trim().to_string())
            .collect()
    })
}

/// The cells of the first row of a rendered table whose first cell is
/// `first`.
#[cfg(test)]
pub fn row_cells(table: &str, first: &str) -> Vec<String> {
    all_row_cells(table)
        .find(|c| c[0] == first)
        .unwrap_or_else(|| panic!("no {first} row in\n{table}"))
}
