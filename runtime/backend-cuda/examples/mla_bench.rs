//! MLA decode attention alone (`Backend::mla_attention`: the split kernel and the merge of its
//! splits) against the measured copy bandwidth: `--batch` sequences of `--ctx` cached tokens,
//! `--queries` query rows per sequence (1 = decode, more = speculative verification), for each
//! head count per GPU in `--heads` (what tensor parallelism leaves of Kimi-K2 / DeepSeek-V3),
//! on the tensor-core kernel and on the CUDA-core one, over an f32 and a bf16 latent cache
//! (`--kv`): the kernel the backend picks (its name in the table), `mla_decode_mma` where that
//! is a grouped one (`mla_decode_mmg*`), each grouped kernel named in `--mmg NAME,..`
//! (`MMG_KERNELS`) at every head count, and the CUDA-core kernel. Bytes = the latent cache the rows read (once per sequence: its query rows share
//! it) plus queries and outputs; the cache holds synthetic values (they do not change the work).
//!
//! `cargo run --release -p weft-cuda --example mla_bench -- [--batch 64] [--ctx 4096] [--queries 1,2] [--heads 8,12,16,64,128] [--kv f32,bf16] [--mmg NAME,..] [--reps 20]`

use std::time::Instant;
use weft_backend::{AttnRow, Backend, KvDtype, KvLayout};
use weft_cuda::{CudaBackend, MmgSpec, MMG_KERNELS};

fn list(args: &[String], flag: &str, default: &[usize]) -> Vec<usize> {
    match args.iter().position(|a| a == flag) {
        Some(i) => args.get(i + 1).expect("a value after the flag").split(',').map(|v| v.parse().expect("a number")).collect(),
        None => default.to_vec(),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let batch = list(&args, "--batch", &[64])[0];
    let ctx = list(&args, "--ctx", &[4096])[0];
    let queries = list(&args, "--queries", &[1, 2]);
    let head_counts = list(&args, "--heads", &[8, 12, 16, 64, 128]);
    let reps = list(&args, "--reps", &[20])[0];
    let named: Vec<&'static MmgSpec> = match args.iter().position(|a| a == "--mmg") {
        Some(i) => args[i + 1].split(',').map(|n| MMG_KERNELS.iter().find(|k| k.name == n).unwrap_or_else(|| panic!("no grouped kernel {n}"))).collect(),
        None => vec![],
    };
    let dtypes: Vec<KvDtype> = match args.iter().position(|a| a == "--kv") {
        Some(i) => args.get(i + 1).expect("f32, bf16 or both after --kv").split(',').map(|v| KvDtype::parse(v).unwrap()).collect(),
        None => vec![KvDtype::F32, KvDtype::Bf16],
    };
    let mut be = CudaBackend::new(0).expect("a CUDA device");
    let copy_bw = be.measure_copy_bandwidth().unwrap();
    let (latent, rd, page) = (512usize, 64usize, 64usize);
    let per_seq = ctx.div_ceil(page);
    let tables: Vec<Vec<u32>> = (0..batch).map(|s| (0..per_seq).map(|p| (p * batch + s) as u32).collect()).collect();
    println!("GPU: {}; measured copy bandwidth {:.0} GB/s; latent {latent} + rope {rd}, pages of {page}", be.device_name, copy_bw / 1e9);
    println!("\n| sequences × context | cache | query rows / seq | heads | kernel | µs | GB/s | % of copy BW |");
    println!("| --- | --- | ---: | ---: | --- | ---: | ---: | ---: |");
    // (tensor cores, grouped kernels where faster, a grouped kernel by name)
    let kernels: Vec<(bool, bool, Option<&'static MmgSpec>)> = if be.mla_mma {
        [(true, true, None), (true, false, None)].into_iter().chain(named.iter().map(|&k| (true, true, Some(k)))).chain([(false, true, None)]).collect()
    } else {
        vec![(false, true, None)]
    };
    for &dtype in &dtypes {
        let layout = KvLayout { layers: 1, num_pages: batch * per_seq, page_size: page, latent_dim: latent, rope_dim: rd, dtype };
        let pool = be.alloc_kv_pool(layout).unwrap();
        let cache = format!("{dtype:?}").to_lowercase();
        for &q in &queries {
            let rows: Vec<AttnRow<'_>> = tables.iter().flat_map(|t| (0..q).map(move |i| AttnRow { block_table: t, ctx_len: ctx - (q - 1 - i) })).collect();
            for &heads in &head_counts {
                let q_lat = be.upload(&vec![0.01; rows.len() * heads * latent]).unwrap();
                let q_pe = be.upload(&vec![0.01; rows.len() * heads * rd]).unwrap();
                let bytes = (batch * ctx * (latent + rd) * dtype.size() + rows.len() * heads * (2 * latent + rd) * 4) as f64;
                let default_kernel = {
                    (be.mla_mma, be.mla_grouped, be.mla_mmg) = (true, true, None);
                    be.mla_decode_kernel(&pool, heads)
                };
                for &(mma, grouped, mmg) in &kernels {
                    if mmg.is_some_and(|k| k.bf16 != (dtype == KvDtype::Bf16)) {
                        continue;
                    }
                    be.mla_mma = mma;
                    be.mla_grouped = grouped;
                    be.mla_mmg = mmg.map(|k| k.name);
                    let kernel = be.mla_decode_kernel(&pool, heads);
                    // the ungrouped row only where it differs from the default
                    if mma && !grouped && kernel == default_kernel {
                        continue;
                    }
                    be.mla_attention(&pool, 0, &q_lat, &q_pe, heads, &rows, 0.06).unwrap();
                    be.synchronize().unwrap();
                    let t = Instant::now();
                    for _ in 0..reps {
                        be.mla_attention(&pool, 0, &q_lat, &q_pe, heads, &rows, 0.06).unwrap();
                    }
                    be.synchronize().unwrap();
                    let secs = t.elapsed().as_secs_f64() / reps as f64;
                    let name = if mma { format!("tensor cores ({kernel})") } else { format!("CUDA cores ({kernel})") };
                    println!("| {batch} × {ctx} | {cache} | {q} | {heads} | {name} | {:.1} | {:.0} | {:.1} % |", secs * 1e6, bytes / secs / 1e9, 100.0 * bytes / secs / copy_bw);
                }
            }
        }
    }
}
