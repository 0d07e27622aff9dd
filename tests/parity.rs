//! Parity kernels against an independent reference and against each other:
//! the scalar kernel is checked against GF(2^8) arithmetic written here from
//! the definition, every SIMD kernel against the scalar kernel on many lengths
//! and alignments, and every one- and two-block RAID6 recovery for 3 to 16
//! members on every kernel (as md's lib/raid6/test does).

use raidfs::parity::{kernels, Parity, ParityError};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Multiplication in GF(2^8) mod 0x11d, carry-less multiply then reduce.
fn gf_mul(a: u8, b: u8) -> u8 {
    let mut product: u16 = 0;
    for bit in 0..8 {
        if b & (1 << bit) != 0 {
            product ^= (a as u16) << bit;
        }
    }
    for bit in (8..16).rev() {
        if product & (1 << bit) != 0 {
            product ^= 0x11d << (bit - 8);
        }
    }
    product as u8
}

fn gf_pow2(exponent: usize) -> u8 {
    (0..exponent).fold(1u8, |x, _| gf_mul(x, 2))
}

/// P and Q straight from the definition: Q = sum of 2^i * D_i.
fn reference_pq(data: &[Vec<u8>]) -> (Vec<u8>, Vec<u8>) {
    let len = data[0].len();
    let mut p = vec![0u8; len];
    let mut q = vec![0u8; len];
    for (i, block) in data.iter().enumerate() {
        let coefficient = gf_pow2(i);
        for j in 0..len {
            p[j] ^= block[j];
            q[j] ^= gf_mul(coefficient, block[j]);
        }
    }
    (p, q)
}

fn random_blocks(rng: &mut StdRng, count: usize, len: usize) -> Vec<Vec<u8>> {
    (0..count)
        .map(|_| {
            let mut block = vec![0u8; len];
            rng.fill(block.as_mut_slice());
            block
        })
        .collect()
}

fn refs(blocks: &[Vec<u8>]) -> Vec<&[u8]> {
    blocks.iter().map(|b| b.as_slice()).collect()
}

fn scalar() -> Parity {
    match Parity::select(Some("scalar")) {
        Ok(parity) => parity,
        Err(e) => panic!("the scalar kernel must always be usable: {e}"),
    }
}

/// Every kernel this CPU runs, forced; kernels it lacks are named on stderr
/// and checked to be refused with the missing feature.
fn runnable_kernels() -> Vec<(&'static str, Parity)> {
    let mut usable = Vec::new();
    for kernel in kernels() {
        match Parity::select(Some(kernel.name())) {
            Ok(parity) => {
                assert_eq!(parity.chosen(), (kernel.name(), kernel.name()));
                usable.push((kernel.name(), parity));
            }
            Err(ParityError::Unsupported(name, missing)) => {
                assert_eq!(name, kernel.name());
                assert!(!kernel.missing_features().is_empty());
                for feature in kernel.missing_features() {
                    assert!(
                        missing.contains(feature),
                        "error names {feature}: {missing}"
                    );
                }
                eprintln!("SKIPPED parity kernel {name}: this CPU lacks {missing}");
            }
            Err(e) => panic!("kernel {} refused unexpectedly: {e}", kernel.name()),
        }
    }
    assert!(usable.iter().any(|(name, _)| *name == "scalar"));
    usable
}

#[test]
fn scalar_matches_the_definition() {
    let mut rng = StdRng::seed_from_u64(1);
    let parity = scalar();
    for count in 1..=16 {
        for len in [1, 7, 64, 333] {
            let data = random_blocks(&mut rng, count, len);
            let (want_p, want_q) = reference_pq(&data);
            let (mut p, mut q) = (vec![0u8; len], vec![0u8; len]);
            parity.pq_gen(&refs(&data), &mut p, &mut q);
            assert_eq!(p, want_p, "P for {count} blocks of {len}");
            assert_eq!(q, want_q, "Q for {count} blocks of {len}");
            let mut x = vec![0u8; len];
            parity.xor_gen(&refs(&data), &mut x);
            assert_eq!(x, want_p, "XOR for {count} blocks of {len}");
        }
    }
}

#[test]
fn every_kernel_generates_what_the_oracle_does_at_any_length_and_alignment() {
    let oracle = scalar();
    let mut rng = StdRng::seed_from_u64(2);
    let mut lengths: Vec<usize> = (1..=130).collect();
    lengths.extend([
        255,
        256,
        257,
        511,
        1000,
        4095,
        4096,
        4097,
        65536 + 13,
        1 << 20,
    ]);
    let max_len = 1 << 20;
    // One shared pool; each case takes its blocks at offsets 0..3 within it.
    let pool = random_blocks(&mut rng, 16, max_len + 64);
    for (name, parity) in runnable_kernels() {
        for (case, &len) in lengths.iter().enumerate() {
            let count = [1, 2, 3, 4, 5, 8, 16][case % 7];
            let align = case % 4;
            let data: Vec<&[u8]> = pool[..count]
                .iter()
                .enumerate()
                .map(|(i, b)| &b[align + i % 3..align + i % 3 + len])
                .collect();
            let mut out = vec![0u8; 4 * len + 8];
            let (want, got) = out.split_at_mut(2 * len + 4);
            let (want_p, want_q) = want.split_at_mut(len + 2);
            let (got_p, got_q) = got.split_at_mut(len + 2);
            // Unaligned destinations too.
            let (want_p, want_q) = (&mut want_p[1..=len], &mut want_q[..len]);
            let (got_p, got_q) = (&mut got_p[2..len + 2], &mut got_q[1..=len]);
            oracle.pq_gen(&data, want_p, want_q);
            parity.pq_gen(&data, got_p, got_q);
            assert!(
                got_p == want_p,
                "{name}: P differs, {count} blocks of {len} at +{align}"
            );
            assert!(
                got_q == want_q,
                "{name}: Q differs, {count} blocks of {len} at +{align}"
            );
            parity.xor_gen(&data, got_p);
            assert!(
                got_p == want_p,
                "{name}: XOR differs, {count} blocks of {len} at +{align}"
            );
        }
    }
}

#[test]
fn every_kernel_handles_several_mib() {
    let oracle = scalar();
    let mut rng = StdRng::seed_from_u64(3);
    let len = (3 << 20) + 5;
    let data = random_blocks(&mut rng, 4, len + 1);
    let data: Vec<&[u8]> = data.iter().map(|b| &b[1..]).collect();
    let (mut want_p, mut want_q) = (vec![0u8; len], vec![0u8; len]);
    oracle.pq_gen(&data, &mut want_p, &mut want_q);
    for (name, parity) in runnable_kernels() {
        let (mut p, mut q) = (vec![0u8; len], vec![0u8; len]);
        parity.pq_gen(&data, &mut p, &mut q);
        assert!(
            p == want_p && q == want_q,
            "{name}: P/Q differ at {len} bytes"
        );
        let mut x = vec![0u8; len];
        parity.xor_gen(&data, &mut x);
        assert!(x == want_p, "{name}: XOR differs at {len} bytes");
    }
}

/// Generates P and Q for random data, loses `failed`, recovers, compares.
fn check_recovery(parity: &Parity, name: &str, stripe: &[Vec<u8>], failed: &[usize]) {
    let mut damaged: Vec<Vec<u8>> = stripe.to_vec();
    for &f in failed {
        for byte in damaged[f].iter_mut() {
            *byte = !*byte ^ 0x5a;
        }
    }
    let mut blocks: Vec<&mut [u8]> = damaged.iter_mut().map(|b| b.as_mut_slice()).collect();
    parity.raid6_recover(&mut blocks, failed);
    for (i, (got, want)) in damaged.iter().zip(stripe).enumerate() {
        assert!(
            got == want,
            "{name}: block {i} wrong after recovering {failed:?} of {} members",
            stripe.len()
        );
    }
}

fn random_stripe(rng: &mut StdRng, oracle: &Parity, k: usize, len: usize) -> Vec<Vec<u8>> {
    let mut stripe = random_blocks(rng, k, len);
    let (mut p, mut q) = (vec![0u8; len], vec![0u8; len]);
    oracle.pq_gen(&refs(&stripe), &mut p, &mut q);
    stripe.push(p);
    stripe.push(q);
    stripe
}

#[test]
fn every_one_and_two_block_failure_recovers_for_3_to_16_members() {
    let oracle = scalar();
    let mut rng = StdRng::seed_from_u64(4);
    // Long enough for the widest unrolled SIMD body, with a ragged tail.
    let len = 1024 + 37;
    let kernels = runnable_kernels();
    for members in 3..=16 {
        let stripe = random_stripe(&mut rng, &oracle, members - 2, len);
        for (name, parity) in &kernels {
            check_recovery(parity, name, &stripe, &[]);
            for x in 0..members {
                check_recovery(parity, name, &stripe, &[x]);
                for y in x + 1..members {
                    check_recovery(parity, name, &stripe, &[x, y]);
                    check_recovery(parity, name, &stripe, &[y, x]);
                }
            }
        }
    }
}

#[test]
fn recovery_handles_odd_lengths() {
    let oracle = scalar();
    let mut rng = StdRng::seed_from_u64(5);
    for (name, parity) in runnable_kernels() {
        for len in [1, 31, 33, 200, 4096 + 1] {
            let stripe = random_stripe(&mut rng, &oracle, 5, len);
            for failed in [[0, 1], [1, 4], [2, 5], [3, 6], [5, 6]] {
                check_recovery(&parity, name, &stripe, &failed);
            }
        }
    }
}

#[test]
fn pq_update_and_xor_into_agree_with_regeneration() {
    let oracle = scalar();
    let mut rng = StdRng::seed_from_u64(6);
    for (name, parity) in runnable_kernels() {
        for (k, len) in [(1, 100), (4, 4096), (7, 1000 + 3), (16, 65536 + 1)] {
            let mut data = random_blocks(&mut rng, k, len);
            let (mut p, mut q) = (vec![0u8; len], vec![0u8; len]);
            parity.pq_gen(&refs(&data), &mut p, &mut q);
            let mut xor_p = p.clone();
            for index in [0, k / 2, k - 1] {
                let new = random_blocks(&mut rng, 1, len).remove(0);
                let delta: Vec<u8> = data[index].iter().zip(&new).map(|(a, b)| a ^ b).collect();
                parity.pq_update(index, &delta, &mut p, &mut q);
                parity.xor_into(&mut xor_p, &data[index]);
                parity.xor_into(&mut xor_p, &new);
                data[index] = new;
                let (mut want_p, mut want_q) = (vec![0u8; len], vec![0u8; len]);
                oracle.pq_gen(&refs(&data), &mut want_p, &mut want_q);
                assert!(p == want_p, "{name}: P after updating block {index} of {k}");
                assert!(q == want_q, "{name}: Q after updating block {index} of {k}");
                assert!(
                    xor_p == want_p,
                    "{name}: xor_into after block {index} of {k}"
                );
            }
        }
    }
}

#[test]
fn unknown_kernels_are_refused_with_the_known_names() {
    match Parity::select(Some("no-such-kernel")) {
        Err(ParityError::Unknown(name, known)) => {
            assert_eq!(name, "no-such-kernel");
            assert!(known.contains("scalar"), "{known}");
        }
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("an unknown kernel was accepted"),
    }
}

/// One test for everything that reads the environment, so no other test races it.
#[test]
fn measured_selection_environment_override_and_report() {
    std::env::remove_var(raidfs::parity::KERNEL_ENV);
    let start = std::time::Instant::now();
    let parity = match Parity::select(None) {
        Ok(parity) => parity,
        Err(e) => panic!("measured selection failed: {e}"),
    };
    let took = start.elapsed();
    eprintln!("selection took {took:?}");
    // The budget is 50 ms on an idle machine; a loaded test machine gets slack.
    assert!(
        took < std::time::Duration::from_millis(500),
        "selection took {took:?}"
    );
    let supported: Vec<&str> = kernels()
        .iter()
        .filter(|k| k.supported())
        .map(|k| k.name())
        .collect();
    let (gen, recov) = parity.chosen();
    assert!(supported.contains(&gen) && supported.contains(&recov));
    assert!(supported.contains(&parity.chosen_xor()));
    let report = parity.report();
    for line in &report {
        eprintln!("{line}");
    }
    let measured: Vec<&str> = kernels()
        .iter()
        .filter(|k| k.supported() && k.measured())
        .map(|k| k.name())
        .collect();
    assert!(measured.contains(&gen) && measured.contains(&recov));
    for name in &measured {
        assert!(report
            .iter()
            .any(|l| l.starts_with(&format!("raid6: {name} gen() "))));
    }
    assert!(report
        .iter()
        .any(|l| l.starts_with(&format!("raid6: using algorithm {gen}"))));
    assert!(report
        .iter()
        .any(|l| l.starts_with(&format!("xor: using function {}", parity.chosen_xor()))));

    std::env::set_var(raidfs::parity::KERNEL_ENV, "scalar");
    let forced = Parity::select(None);
    std::env::set_var(raidfs::parity::KERNEL_ENV, "no-such-kernel");
    let refused = Parity::select(None);
    std::env::remove_var(raidfs::parity::KERNEL_ENV);
    match forced {
        Ok(parity) => {
            assert_eq!(parity.chosen(), ("scalar", "scalar"));
            assert!(parity.report().iter().any(|l| l.contains("forced")));
        }
        Err(e) => panic!("forcing scalar through the environment failed: {e}"),
    }
    assert!(matches!(refused, Err(ParityError::Unknown(..))));
    let global = Parity::global();
    assert!(supported.contains(&global.chosen().0));
}

/// `raidfs bench` prints a row per operation and the choice, as a table and as JSON.
#[test]
fn bench_command_prints_the_table_and_the_choice() {
    let run = |args: &[&str]| {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_raidfs"))
            .arg("bench")
            .args(args)
            .output();
        match output {
            Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).into_owned(),
            Ok(o) => panic!(
                "raidfs bench {args:?} failed: {}",
                String::from_utf8_lossy(&o.stderr)
            ),
            Err(e) => panic!("cannot run raidfs: {e}"),
        }
    };
    let table = run(&["--kernel", "scalar"]);
    for needle in [
        "xor 4+1",
        "pq 4+2",
        "recover 2 data",
        "cold 64 KiB",
        "raid6: using algorithm",
        "chosen: xor ",
    ] {
        assert!(table.contains(needle), "table lacks {needle:?}:\n{table}");
    }
    let json: serde_json::Value =
        match serde_json::from_str(&run(&["--kernel", "scalar", "--json"])) {
            Ok(value) => value,
            Err(e) => panic!("bench --json is not JSON: {e}"),
        };
    let results = json["results"].as_array().map_or(0, |r| r.len());
    assert_eq!(results, 3, "one row per operation for one kernel: {json}");
    assert!(json["results"][1]["gb_per_s"]["cold_64KiB"]
        .as_f64()
        .is_some_and(|r| r > 0.0));
    assert!(json["chosen"]["gen"].is_string());
}
