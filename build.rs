// Generates the `.ef` parser from src/parse/grammar.lalrpop into OUT_DIR.
fn main() {
    if let Err(err) = lalrpop::process_src() {
        eprintln!("lalrpop: {err}");
        std::process::exit(1);
    }
}
