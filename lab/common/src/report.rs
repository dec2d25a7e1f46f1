//! Printing results as an aligned table and as JSON lines.

/// Print `rows` under `headers` as an aligned text table (first column left-aligned,
/// the others right-aligned).
pub fn print_table(headers: &[&str], rows: &[Vec<String>]) {
    let widths: Vec<usize> = headers
        .iter()
        .enumerate()
        .map(|(i, h)| {
            rows.iter()
                .map(|r| r[i].len())
                .chain([h.len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: Vec<String>| {
        let parts: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| {
                if i == 0 {
                    format!("{c:<w$}", w = widths[i])
                } else {
                    format!("{c:>w$}", w = widths[i])
                }
            })
            .collect();
        println!("{}", parts.join("  ").trim_end());
    };
    line(headers.iter().map(|h| h.to_string()).collect());
    println!(
        "{}",
        widths
            .iter()
            .map(|w| "-".repeat(*w))
            .collect::<Vec<_>>()
            .join("  ")
    );
    for r in rows {
        line(r.clone());
    }
}

/// Print `value` as one JSON line prefixed with `JSON ` (easy to grep out of the output).
pub fn print_json(value: &impl serde::Serialize) {
    match serde_json::to_string(value) {
        Ok(s) => println!("JSON {s}"),
        Err(e) => eprintln!("cannot encode result as JSON: {e}"),
    }
}
