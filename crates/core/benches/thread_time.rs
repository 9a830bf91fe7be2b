//! A criterion measurement of the benchmark thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`)
//! rather than wall-clock time. This machine's two cores are shared with other jobs; CPU time
//! measures the per-core cost of single-threaded code without counting time spent preempted.
//! Multi-threaded benchmarks must use wall-clock time instead (CPU time of other threads is not
//! counted here).

use criterion::measurement::{Measurement, ValueFormatter};
use criterion::Throughput;

/// CPU time of the calling thread, in nanoseconds.
pub struct ThreadTime;

fn thread_cpu_nanoseconds() -> u64 {
    let mut time = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `time` is a valid, writable timespec for the duration of the call.
    let result = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut time) };
    assert_eq!(result, 0, "CLOCK_THREAD_CPUTIME_ID is available on Linux");
    time.tv_sec as u64 * 1_000_000_000 + time.tv_nsec as u64
}

impl Measurement for ThreadTime {
    type Intermediate = u64;
    type Value = u64;

    fn start(&self) -> u64 {
        thread_cpu_nanoseconds()
    }
    fn end(&self, start: u64) -> u64 {
        thread_cpu_nanoseconds() - start
    }
    fn add(&self, left: &u64, right: &u64) -> u64 {
        left + right
    }
    fn zero(&self) -> u64 {
        0
    }
    fn to_f64(&self, value: &u64) -> f64 {
        *value as f64
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        &CpuTimeFormatter
    }
}

/// Prints CPU nanoseconds as milliseconds and byte throughputs in decimal GB/s.
struct CpuTimeFormatter;

impl ValueFormatter for CpuTimeFormatter {
    fn scale_values(&self, _typical: f64, values: &mut [f64]) -> &'static str {
        for value in values {
            *value /= 1e6;
        }
        "ms (cpu)"
    }

    fn scale_throughputs(
        &self,
        _typical: f64,
        throughput: &Throughput,
        values: &mut [f64],
    ) -> &'static str {
        let units = match *throughput {
            Throughput::Bytes(bytes) | Throughput::BytesDecimal(bytes) => bytes as f64,
            Throughput::Elements(elements) | Throughput::ElementsAndBytes { elements, .. } => {
                elements as f64
            }
            Throughput::Bits(bits) => bits as f64 / 8.0,
        };
        for value in values {
            *value = units / *value;
        }
        "GB/s (cpu)"
    }

    fn scale_for_machines(&self, _values: &mut [f64]) -> &'static str {
        "ns"
    }
}
