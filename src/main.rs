//! The `efopt` command-line tool; see `efopt --help`.

fn main() {
    // The driver recurses over nesting bounded by the grammar; a larger stack gives headroom
    // on every platform.
    let args: Vec<String> = std::env::args().skip(1).collect();
    efopt::init_thread_pool();
    let code = std::thread::Builder::new()
        .stack_size(efopt::THREAD_STACK)
        .spawn(move || efopt::driver::run(&args))
        .map(|h| h.join().unwrap_or(101))
        .unwrap_or(101);
    std::process::exit(code);
}
