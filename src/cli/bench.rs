//! `raidfs bench`: every parity kernel this CPU runs (or the one named),
//! timed on generation (XOR 4+1, P+Q 4+2) and two-data-block recovery at
//! 4 KiB, 64 KiB and 1 MiB chunks in cache, and at 64 KiB chunks cycling
//! through a 256 MiB working set ("cold"), plus the kernels `select` chooses
//! and, as the row `selected`, that selection itself (which switches to a
//! streaming-store twin for calls whose sources are cold).
//! Rates are GB/s (10^9 bytes) of data blocks processed.

use std::time::{Duration, Instant};

use crate::parity::{kernels, Parity};

#[derive(clap::Args)]
pub struct BenchArgs {
    /// Another benchmark instead of the parity kernels.
    #[command(subcommand)]
    pub what: Option<BenchWhat>,
    /// Print the results as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Benchmark only this kernel (e.g. avx2x4; see the table for names).
    #[arg(long, value_name = "NAME")]
    pub kernel: Option<String>,
}

const DATA_BLOCKS: usize = 4;
const HOT_CHUNKS: [usize; 3] = [4 << 10, 64 << 10, 1 << 20];
const COLD_CHUNK: usize = 64 << 10;
const COLD_SET: usize = 256 << 20;
/// Each cell is the best of WINDOWS timed windows, taken in turns across all
/// kernels: on a shared machine a window can lose the CPU, the best one
/// rarely does.
const WINDOWS: usize = 5;
const HOT_TIME: Duration = Duration::from_millis(15);
const COLD_TIME: Duration = Duration::from_millis(30);
/// The row label of the measured selection (`Parity::select(None)`).
const SELECTED: &str = "selected";
/// Streaming stores need register-aligned destinations (64 bytes covers
/// every kernel); a plain Vec is only 16-byte aligned.
const ALIGN: usize = 64;

#[derive(Clone, Copy, PartialEq)]
enum Op {
    Xor,
    Pq,
    Recover,
}

impl Op {
    const ALL: [Op; 3] = [Op::Xor, Op::Pq, Op::Recover];
    fn label(self) -> &'static str {
        match self {
            Op::Xor => "xor 4+1",
            Op::Pq => "pq 4+2",
            Op::Recover => "recover 2 data",
        }
    }
    fn key(self) -> &'static str {
        match self {
            Op::Xor => "xor_gen",
            Op::Pq => "pq_gen",
            Op::Recover => "recover_2data",
        }
    }
}

/// Stripes of DATA_BLOCKS data chunks, P and Q, back to back in one buffer.
struct Stripes {
    bytes: Vec<u8>,
    /// Offset of the first stripe in `bytes`, ALIGN-aligned.
    start: usize,
    chunk: usize,
    /// The stripe the next run starts at: cycling continues across windows.
    next: usize,
}

impl Stripes {
    fn new(chunk: usize, total: usize) -> Stripes {
        let stripe = (DATA_BLOCKS + 2) * chunk;
        let count = (total / stripe).max(1);
        let mut bytes = vec![0u8; count * stripe + ALIGN];
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for word in bytes.chunks_exact_mut(8) {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            word.copy_from_slice(&seed.to_le_bytes());
        }
        let start = bytes.as_ptr().align_offset(ALIGN).min(ALIGN);
        Stripes {
            bytes,
            start,
            chunk,
            next: 0,
        }
    }
    fn count(&self) -> usize {
        (self.bytes.len() - ALIGN) / ((DATA_BLOCKS + 2) * self.chunk)
    }
    /// Runs `op` once on stripe `i`.
    fn run(&mut self, parity: &Parity, op: Op, i: usize) {
        let stripe_len = (DATA_BLOCKS + 2) * self.chunk;
        let at = self.start + i * stripe_len;
        let stripe = &mut self.bytes[at..at + stripe_len];
        let mut blocks: Vec<&mut [u8]> = stripe.chunks_exact_mut(self.chunk).collect();
        match op {
            Op::Recover => parity.raid6_recover(&mut blocks, &[0, 1]),
            Op::Xor | Op::Pq => {
                let (data, parity_blocks) = blocks.split_at_mut(DATA_BLOCKS);
                let data: Vec<&[u8]> = data.iter().map(|d| &**d).collect();
                let (p, q) = parity_blocks.split_at_mut(1);
                if op == Op::Xor {
                    parity.xor_gen(&data, p[0]);
                } else {
                    parity.pq_gen(&data, p[0], q[0]);
                }
            }
        }
    }
    /// GB/s of data over about `time`, cycling through every stripe.
    fn rate(&mut self, parity: &Parity, op: Op, time: Duration) -> f64 {
        let count = self.count();
        self.run(parity, op, self.next % count);
        let start = Instant::now();
        let mut runs = 0usize;
        while start.elapsed() < time {
            // Enough runs between clock reads that the clock costs nothing.
            for _ in 0..8 {
                self.next = (self.next + 1) % count;
                self.run(parity, op, self.next);
                runs += 1;
            }
        }
        (runs * DATA_BLOCKS * self.chunk) as f64 / start.elapsed().as_secs_f64() / 1e9
    }
}

struct Row {
    kernel: String,
    op: Op,
    /// GB/s at each of HOT_CHUNKS, then cold.
    rates: Vec<f64>,
}

#[derive(clap::Subcommand)]
pub enum BenchWhat {
    /// The read balancer on simulated disks: the linux-raid "two mirrors are
    /// faster than three" experiment, for every policy.
    Balance(super::bench_balance::BalanceArgs),
    /// Mount the FUSE floor: a filesystem that stores no data (writes are
    /// dropped, reads return zeros), served with the session `raidfs mount
    /// -o OPTIONS` gives an array, until it is unmounted. A benchmark run
    /// on it is the most any daemon reaches through FUSE here.
    FuseFloor(super::bench_floor::FloorArgs),
}

pub fn run(args: BenchArgs) -> i32 {
    match args.what {
        Some(BenchWhat::Balance(b)) => return super::bench_balance::run(b),
        Some(BenchWhat::FuseFloor(f)) => return super::bench_floor::run(f),
        None => {}
    }
    let chosen = match Parity::select(None) {
        Ok(parity) => parity,
        Err(e) => return super::fail(e),
    };
    let names: Vec<String> = match &args.kernel {
        Some(name) => vec![name.clone()],
        None => kernels()
            .iter()
            .filter(|k| k.supported())
            .map(|k| k.name().to_string())
            .collect(),
    };
    let mut forced = Vec::new();
    for name in &names {
        match Parity::select(Some(name)) {
            Ok(parity) => forced.push((name.clone(), parity)),
            Err(e) => return super::fail(e),
        }
    }
    let mut contenders: Vec<(String, &Parity)> =
        forced.iter().map(|(name, p)| (name.clone(), p)).collect();
    // The measured selection itself: its kernels plus the switch to a
    // streaming twin for cold sources, which no forced kernel shows.
    if args.kernel.is_none() {
        contenders.push((SELECTED.to_string(), &chosen));
    }
    let mut hot: Vec<Stripes> = HOT_CHUNKS.iter().map(|&c| Stripes::new(c, 0)).collect();
    let mut cold = Stripes::new(COLD_CHUNK, COLD_SET);
    let mut rows: Vec<Row> = contenders
        .iter()
        .flat_map(|(name, _)| {
            Op::ALL.map(|op| Row {
                kernel: name.clone(),
                op,
                rates: vec![0.0; HOT_CHUNKS.len() + 1],
            })
        })
        .collect();
    // Windows outermost: a burst from a neighbour then costs every kernel one
    // window rather than one kernel all of its windows.
    for _ in 0..WINDOWS {
        let mut row = rows.iter_mut();
        for (_, parity) in &contenders {
            for op in Op::ALL {
                let Some(row) = row.next() else { continue };
                for (slot, stripes) in hot.iter_mut().enumerate() {
                    row.rates[slot] = row.rates[slot].max(stripes.rate(parity, op, HOT_TIME));
                }
                let cold_slot = HOT_CHUNKS.len();
                row.rates[cold_slot] = row.rates[cold_slot].max(cold.rate(parity, op, COLD_TIME));
            }
        }
    }
    if args.json {
        match json(&chosen, &rows) {
            Ok(text) => emit(&text),
            Err(e) => super::fail(format!("cannot format the results as JSON: {e}")),
        }
    } else {
        emit(&table(&chosen, &rows))
    }
}

fn table(chosen: &Parity, rows: &[Row]) -> String {
    let mut out = String::new();
    out += &format!(
        "parity kernels, GB/s of data ({DATA_BLOCKS} data blocks; best of {WINDOWS} windows; \
         cold = 64 KiB chunks cycling through 256 MiB)\n"
    );
    out += &format!(
        "{:<12} {:<15} {:>8} {:>8} {:>8} {:>12}\n",
        "kernel", "operation", "4 KiB", "64 KiB", "1 MiB", "cold 64 KiB"
    );
    for row in rows {
        let kernel = if row.op == Op::Xor {
            row.kernel.as_str()
        } else {
            ""
        };
        out += &format!(
            "{:<12} {:<15} {:>8.1} {:>8.1} {:>8.1} {:>12.1}\n",
            kernel,
            row.op.label(),
            row.rates[0],
            row.rates[1],
            row.rates[2],
            row.rates[3]
        );
    }
    out += "\nstart-up selection (what a mount logs):\n";
    for line in chosen.report() {
        out += &format!("  {line}\n");
    }
    let (gen, recover) = chosen.chosen();
    let (xor_cold, gen_cold) = chosen.chosen_cold();
    let cold =
        |kernel: Option<&str>| kernel.map_or(String::new(), |k| format!(" ({k} for cold sources)"));
    out += &format!(
        "chosen: xor {}{}, generation {gen}{}, recovery {recover}\n",
        chosen.chosen_xor(),
        cold(xor_cold),
        cold(gen_cold)
    );
    out
}

fn json(chosen: &Parity, rows: &[Row]) -> Result<String, serde_json::Error> {
    let (gen, recover) = chosen.chosen();
    let (xor_cold, gen_cold) = chosen.chosen_cold();
    let results: Vec<serde_json::Value> = rows
        .iter()
        .map(|row| {
            serde_json::json!({
                "kernel": row.kernel,
                "operation": row.op.key(),
                "gb_per_s": {
                    "4KiB": row.rates[0],
                    "64KiB": row.rates[1],
                    "1MiB": row.rates[2],
                    "cold_64KiB": row.rates[3],
                },
            })
        })
        .collect();
    let document = serde_json::json!({
        "data_blocks": DATA_BLOCKS,
        "unit": "GB/s of data blocks (1e9 bytes/s)",
        "chosen": {
            "xor": chosen.chosen_xor(),
            "gen": gen,
            "recover": recover,
            "xor_cold_sources": xor_cold,
            "gen_cold_sources": gen_cold,
        },
        "report": chosen.report(),
        "results": results,
    });
    Ok(serde_json::to_string_pretty(&document)? + "\n")
}

/// Writes `text` to stdout; a closed pipe (`| head`) is not an error.
fn emit(text: &str) -> i32 {
    use std::io::Write;
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Ok(()) => 0,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => 0,
        Err(e) => super::fail(format!("cannot write the results: {e}")),
    }
}
