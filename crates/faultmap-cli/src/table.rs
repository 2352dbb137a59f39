//! Plain-text tables: label columns on the left, numbers aligned on the
//! right, two spaces between columns, no borders, readable in a terminal and in a mail.

use std::fmt::Write as _;

/// A table being built row by row.
#[derive(Debug, Default)]
pub struct Table {
    /// How many leading columns are labels (left-aligned).
    labels: usize,
    /// A later column that is left-aligned too (free text after numbers).
    note: Option<usize>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table whose first `labels` columns are left-aligned.
    pub fn new(labels: usize) -> Self {
        Self {
            labels,
            note: None,
            rows: Vec::new(),
        }
    }

    /// Makes column `column` left-aligned: a note after the numbers.
    pub fn note_column(mut self, column: usize) -> Self {
        self.note = Some(column);
        self
    }

    /// Adds a row; rows may have different lengths (missing cells are blank).
    pub fn row<S: Into<String>>(&mut self, cells: impl IntoIterator<Item = S>) {
        self.rows.push(cells.into_iter().map(Into::into).collect());
    }

    /// The table as text, one line per row, each ending in a newline.
    pub fn render(&self) -> String {
        let widths = self.widths();
        let mut out = String::new();
        for row in &self.rows {
            let mut line = String::new();
            for (i, width) in widths.iter().enumerate() {
                let cell = row.get(i).map_or("", String::as_str);
                if i > 0 {
                    line.push_str("  ");
                }
                if i < self.labels || self.note == Some(i) {
                    let _ = write!(line, "{cell:<width$}");
                } else {
                    let _ = write!(line, "{cell:>width$}");
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }

    fn widths(&self) -> Vec<usize> {
        let columns = self.rows.iter().map(Vec::len).max().unwrap_or(0);
        (0..columns)
            .map(|i| {
                self.rows
                    .iter()
                    .filter_map(|row| row.get(i))
                    .map(|cell| cell.chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligns_labels_left_and_numbers_right() {
        let mut t = Table::new(1);
        t.row(["name", "value"]);
        t.row(["pgfault", "16"]);
        t.row(["x", "1,024", "extra"]);
        assert_eq!(
            t.render(),
            "name     value\npgfault     16\nx        1,024  extra\n"
        );
        let mut t = Table::new(1).note_column(2);
        t.row(["a", "1", "long note"]);
        t.row(["b", "22", "x"]);
        assert_eq!(t.render(), "a   1  long note\nb  22  x\n");
    }
}
