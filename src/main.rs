fn main() {
    std::process::exit(raidfs::cli::main());
}
