//! `CudaEval::new` on whatever machine the tests run on: without a driver it
//! must fail with an error that tells the user what to do; with a GPU it must
//! open the device and evaluate an empty batch.

use suffuse_accel_cuda::{CudaError, CudaEval, driver_library_present};
use suffuse_core::batch::BatchEval;
use suffuse_core::fss::{KeyBatch, Params, Party};
use suffuse_core::ring::Width;

#[test]
fn new_fails_clearly_without_a_driver_or_opens_the_device() {
    match CudaEval::new() {
        Err(e) => {
            if !driver_library_present() {
                assert!(matches!(e, CudaError::DriverNotFound), "{e:?}");
            }
            let message = e.to_string();
            assert!(message.contains("CUDA"), "{message}");
            assert!(message.contains("CpuEval"), "{message}");
            if let CudaError::DriverNotFound = e {
                assert!(message.contains("libcuda.so"), "{message}");
                assert!(message.contains("NVIDIA driver"), "{message}");
            }
        }
        Ok(gpu) => {
            assert!(driver_library_present());
            assert!(!gpu.device_name().is_empty());
            let params = Params::dcf_bit(Width::of(16));
            let keys = KeyBatch::new(params, Party::P0, &[]).unwrap();
            assert_eq!(gpu.eval(&keys, &[], &mut []), Ok(Default::default()));
        }
    }
}

#[test]
fn missing_device_names_the_ordinal() {
    let e = CudaError::NoDevice {
        ordinal: 3,
        available: 1,
    };
    let message = e.to_string();
    assert!(message.contains("device 3"), "{message}");
    assert!(message.contains("1 device"), "{message}");
}
