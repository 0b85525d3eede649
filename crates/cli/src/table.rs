//! Plain text: tables (a header row, then rows, columns padded to fit),
//! plurals, wrapped lines and binary sizes.

/// `n` and the noun, singular for one: `plural(2, "THP", "THPs")` is "2 THPs".
pub fn plural(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// Binary units, two decimals (vmemmap totals are rarely whole GiB).
pub fn human(bytes: u64) -> String {
    const UNITS: [(u64, &str); 4] = [
        (1 << 40, "TiB"),
        (1 << 30, "GiB"),
        (1 << 20, "MiB"),
        (1 << 10, "KiB"),
    ];
    UNITS
        .iter()
        .find(|(unit, _)| bytes >= *unit)
        .map_or(format!("{bytes} B"), |(unit, name)| {
            format!("{:.2} {name}", bytes as f64 / *unit as f64)
        })
}

/// `text` wrapped at word boundaries into lines of at most `first` characters
/// for the first line and `width` for the others (a word longer than its
/// line gets a line of its own); at least one line, empty for no words.
pub fn wrap(text: &str, first: usize, width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = String::new();
    let mut room = first;
    for word in text.split_whitespace() {
        if !line.is_empty() && line.chars().count() + 1 + word.chars().count() > room {
            lines.push(std::mem::take(&mut line));
            room = width;
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    lines.push(line);
    lines
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

#[cfg(test)]
mod tests {
    use super::wrap;

    #[test]
    fn wrap_fills_lines_to_their_widths() {
        assert_eq!(wrap("aa bb cc dd", 5, 8), ["aa bb", "cc dd"]);
        assert_eq!(wrap("aa bb cc dd", 2, 8), ["aa", "bb cc dd"]);
        // A word longer than the line is a line of its own.
        assert_eq!(wrap("a verylongword b", 6, 6), ["a", "verylongword", "b"]);
        assert_eq!(wrap("  ", 6, 6), [""]);
    }
}
