//! GPU models: the throughputs and limits the cost model divides by, read from
//! `data/devices.json` (one entry per GPU, each number with its source).

use serde::Deserialize;
use std::collections::BTreeMap;
use std::sync::OnceLock;

#[derive(Clone, Debug, Deserialize)]
pub struct Device {
    /// What `rank{device=…}` names it.
    pub name: String,
    pub full_name: String,
    pub sms: u64,
    pub dram_bytes_per_s: f64,
    pub l2_bytes: u64,
    pub smem_per_block: u64,
    pub smem_per_sm: u64,
    /// 32-bit registers.
    pub regs_per_sm: u64,
    pub max_regs_per_thread: u64,
    pub max_warps_per_sm: u64,
    pub max_blocks_per_sm: u64,
    /// Dense tensor-core rates; a multiply-add counts 2.
    pub tensor_bf16_flops: f64,
    pub tensor_tf32_flops: f64,
    /// Rows a tensor-core instruction multiplies at once: a product block with fewer rows
    /// costs as many.
    pub tensor_min_rows: u64,
    /// CUDA-core f32 operations (one per elementwise operation or reduction step).
    pub cuda_f32_ops: f64,
    /// Special-function results (exp, log, rsqrt, …).
    pub sfu_ops: f64,
    pub launch_s: f64,
    /// Time from a load's issue to its data under load (DRAM).
    pub dram_latency_s: f64,
    /// The datasheet or measurement behind each number.
    pub sources: BTreeMap<String, String>,
}

#[derive(Deserialize)]
struct DeviceFile {
    devices: Vec<Device>,
}

/// Every known device, in the file's order.
pub fn devices() -> &'static [Device] {
    static DEVICES: OnceLock<Vec<Device>> = OnceLock::new();
    DEVICES.get_or_init(|| {
        // The file is part of the build: a malformed one fails the device tests, not a user.
        serde_json::from_str::<DeviceFile>(include_str!("../../data/devices.json"))
            .map(|f| f.devices)
            .unwrap_or_default()
    })
}

/// The device `name` names, or the message listing the known ones.
pub fn device(name: &str) -> Result<&'static Device, String> {
    devices().iter().find(|d| d.name == name).ok_or_else(|| {
        let known: Vec<&str> = devices().iter().map(|d| d.name.as_str()).collect();
        format!(
            "unknown device `{name}`; known devices: {}",
            known.join(", ")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_four_devices_parse_with_a_source_for_every_rate() {
        let names: Vec<&str> = devices().iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["h100", "h200", "a100", "rtx5090"]);
        for d in devices() {
            for key in [
                "dram_bytes_per_s",
                "tensor_bf16_flops",
                "tensor_tf32_flops",
                "cuda_f32_ops",
                "sfu_ops",
                "sms",
                "l2_bytes",
                "smem_per_block",
                "regs_per_sm",
                "launch_s",
                "dram_latency_s",
                "tensor_min_rows",
            ] {
                assert!(
                    d.sources.contains_key(key),
                    "{}: no source for {key}",
                    d.name
                );
            }
            assert!(d.smem_per_block <= d.smem_per_sm, "{}", d.name);
            assert!(d.tensor_tf32_flops < d.tensor_bf16_flops, "{}", d.name);
        }
        // The project's H100 measurements.
        let h100 = device("h100").unwrap();
        assert_eq!(h100.dram_bytes_per_s, 3.0e12);
        assert_eq!(h100.tensor_bf16_flops, 7.98e14);
    }

    #[test]
    fn an_unknown_device_lists_the_known_ones() {
        let e = device("v100").unwrap_err();
        assert!(e.contains("h100, h200, a100, rtx5090"), "{e}");
    }
}
