//! The rank cost model on hand-computed cases (docs/rank.md): a tiled matrix product's DRAM
//! traffic at two schedules (a tile several programs read, with the L2 rule), a load every
//! program repeats (replicated), a value every program recomputes, a 32-program grid on the
//! 132 SMs of an H100, and the legality limits. Every expected number is written out here
//! from the sizes and the device's data, not taken from the code under test.

use efopt::rank::device::device;
use efopt::rank::model::{FunctionModel, Point, Resource, Unit};

const MM: &str = "
func mm where M = 4096, K = 4096, N = 4096 {
  a: tensor<MxK, bf16> = input
  b: tensor<KxN, bf16> = input
  at = partition[K,k](replicate[n](partition[M,m](a)))
  bt = partition[K,k](partition[N,n](replicate[m](b)))
  p = tile_matmul(at, bt) acc=f32
  c = reduce p parallel=k reducer=@add
  return combination[M,m](combination[N,n](c))
}
";

const ROWS: &str = "
func rows where R = 32, H = 4096 {
  x: tensor<RxH, bf16> = input
  g: tensor<H, bf16> = input
  xt = cast(partition[R,r](x)) to=f32
  gt = replicate[r](g)
  y = xt * exp(gt)
  return combination[R,r](y)
}
";

fn with_model<T>(src: &str, f: impl FnOnce(&FunctionModel) -> T) -> T {
    let mut m = efopt::parse::parse_module(src, 0).expect("parses");
    let info = efopt::verify::verify_module(&mut m).expect("verifies");
    let plan = efopt::lower::plan(&info, &m.funcs[0]).expect("plans");
    let dev = device("h100").unwrap();
    let model = FunctionModel::new(&plan, dev);
    f(&model)
}

fn point(model: &FunctionModel, blocks: &[(&str, u64)], warps: u64, stages: u64) -> Point {
    let log_blocks = model
        .axes
        .iter()
        .map(|a| {
            let b = blocks
                .iter()
                .find(|(n, _)| n == a)
                .expect("a block per axis")
                .1;
            b.ilog2()
        })
        .collect();
    Point {
        log_blocks,
        num_warps: warps,
        num_stages: stages,
    }
}

fn close(got: f64, want: f64) {
    assert!(
        (got - want).abs() <= 1e-9 * want.abs().max(1.0),
        "got {got}, want {want}"
    );
}

#[test]
fn a_tiled_product_s_traffic_at_two_schedules() {
    let h100 = device("h100").unwrap();
    with_model(MM, |model| {
        assert_eq!(model.axes, ["k", "m", "n"]);
        let (m, n, k) = (4096.0f64, 4096.0f64, 4096.0f64);
        let operand = m * k * 2.0; // bytes of A (and of B)
        let store = m * n * 4.0;
        let half_l2 = 52428800.0 / 2.0;
        assert!(operand > half_l2, "neither operand fits in half the L2");

        // 128×128 output tiles, depth 64, 8 warps, 3 stages.
        let c = model
            .eval(
                h100,
                &point(model, &[("m", 128), ("n", 128), ("k", 64)], 8, 3),
            )
            .expect("legal");
        let kc = &c.kernels[0];
        let programs = (m / 128.0) * (n / 128.0);
        assert_eq!(kc.programs, programs);
        // Shared memory: (128×64 + 64×128) bf16 × 3 stages = 98,304 B: 2 blocks per SM.
        // Registers: the 128×128 f32 accumulator and the 128×128 product, over 256 threads:
        // 128 + 32 reserved = 160 a thread: 65,536 / (160·256) = 1 block per SM.
        assert_eq!(kc.occupancy, 1);
        let waves = (programs / 132.0).ceil();
        assert_eq!(kc.waves, waves);
        // A's tile is read by every program along n (not adjacent in launch order: m varies
        // fastest): once per wave, not per program (which would be operand × N/128).
        let a_bytes = (operand * waves).min(operand * n / 128.0);
        // B's tiles are shared along m, adjacent: a wave's share fits in L2, read once.
        let want = a_bytes + operand + store;
        close(kc.dram_bytes, want);
        assert_eq!(kc.dram_bytes, 369_098_752.0);
        // Tensor cores: 2·M·N·K at the bf16 rate, over a utilisation of P/(waves·SMs).
        let flops = 2.0 * m * n * k;
        close(kc.flops[Unit::TensorBf16 as usize], flops);
        let util = programs / (waves * 132.0);
        close(c.us, 2.0 + flops / 7.98e14 / util * 1e6);
        assert_eq!(kc.bottleneck, Resource::TensorCores);

        // 16×16×16, 4 warps: 65,536 programs, 12 blocks per SM by registers
        // ((256 + 256)/128 + 32 = 36, allocated as 40: 65,536/(40·128) = 12).
        let c = model
            .eval(
                h100,
                &point(model, &[("m", 16), ("n", 16), ("k", 16)], 4, 3),
            )
            .expect("legal");
        let kc = &c.kernels[0];
        assert_eq!(kc.programs, 65536.0);
        assert_eq!(kc.occupancy, 12);
        let waves = (65536.0f64 / (132.0 * 12.0)).ceil();
        assert_eq!(kc.waves, waves);
        let want = operand * waves + operand + store;
        close(kc.dram_bytes, want);
        assert!(kc.dram_bytes > 4.0 * 369_098_752.0);
        // Hopper's tensor cores multiply 64 rows at a time: 16-row blocks cost four times
        // the product's 2·M·N·K.
        close(kc.flops[Unit::TensorBf16 as usize], 4.0 * flops);
    });
}

#[test]
fn illegal_schedules_are_refused() {
    let h100 = device("h100").unwrap();
    with_model(MM, |model| {
        // 128×128 at 4 warps: (16,384 + 16,384)/128 + 32 = 288 registers a thread.
        assert!(model
            .eval(
                h100,
                &point(model, &[("m", 128), ("n", 128), ("k", 64)], 4, 3)
            )
            .is_none());
        // 256×256×128 tiles: (256·128 + 128·256)·2 B = 131,072 B a stage; 2 stages exceed
        // the 227 KB of a block.
        assert!(model
            .eval(
                h100,
                &point(model, &[("m", 256), ("n", 256), ("k", 128)], 16, 2)
            )
            .is_none());
    });
}

#[test]
fn a_replicated_load_a_recomputed_value_and_a_small_grid() {
    let h100 = device("h100").unwrap();
    with_model(ROWS, |model| {
        let (r, h) = (32.0f64, 4096.0f64);
        let c = model
            .eval(h100, &point(model, &[("r", 1)], 4, 3))
            .expect("legal");
        let kc = &c.kernels[0];
        assert_eq!(kc.programs, 32.0);
        // x: each program its row; g: every program loads all of it (32 requests of 8 KB),
        // from DRAM once (it fits in L2); y stored once in f32.
        let dram = r * h * 2.0 + h * 2.0 + r * h * 4.0;
        assert_eq!(kc.dram_bytes, dram);
        // exp(g) does not vary along r: each of the 32 programs computes it (recomputation
        // counts), and the product is computed once per element.
        assert_eq!(kc.flops[Unit::Sfu as usize], 32.0 * h);
        assert_eq!(kc.flops[Unit::Cuda as usize], r * h);
        // 32 programs on 132 SMs: a quarter of the bandwidth.
        assert_eq!(kc.waves, 1.0);
        let util = 32.0 / 132.0;
        close(c.us, 2.0 + dram / 3.0e12 / util * 1e6);
        assert_eq!(kc.bottleneck, Resource::Dram);

        // Two rows a program: 16 programs recompute exp(g), half as much work, and an
        // eighth of the SMs busy.
        let c = model
            .eval(h100, &point(model, &[("r", 2)], 4, 3))
            .expect("legal");
        let kc = &c.kernels[0];
        assert_eq!(kc.programs, 16.0);
        assert_eq!(kc.flops[Unit::Sfu as usize], 16.0 * h);
        close(c.us, 2.0 + dram / 3.0e12 / (16.0 / 132.0) * 1e6);
    });
}

/// The paper's row sum with intermediate storage (examples/rowsum_collection.ef): each of the
/// |p| programs stores its M partial sums, and the second kernel reads all |p| × M back. The
/// stored buffer is `|p| x M`: its bytes grow with the tiles of `p` (before, the extent
/// counted one slice, and a 65,536-program split's 268 MB store was priced at 8 KB).
#[test]
fn a_collection_stores_one_slice_per_tile() {
    const ROWSUM: &str = "
func rowsum where M = 64, K = 4096 {
  x: tensor<MxK, f32> = input
  x_tile = partition[K,p](x)
  partial = reduce x_tile axis=K reducer=@add
  stored = collection[p](partial)
  output = reduce stored axis=0 reducer=@add
  return output
}
";
    let h100 = device("h100").unwrap();
    with_model(ROWSUM, |model| {
        assert_eq!(model.axes, ["p"]);
        for block in [16u64, 64, 256] {
            let c = model
                .eval(h100, &point(model, &[("p", block)], 4, 1))
                .expect("legal");
            let tiles = 4096.0 / block as f64;
            let slices = tiles * 64.0 * 4.0; // |p| slices of M f32 sums
            let input = 64.0 * 4096.0 * 4.0;
            assert_eq!(c.kernels.len(), 2);
            assert_eq!(c.kernels[0].programs, tiles);
            close(c.kernels[0].dram_bytes, input + slices);
            // The second kernel reads every slice and writes M sums.
            close(c.kernels[1].dram_bytes, slices + 64.0 * 4.0);
        }
    });
}
