//! The function under test, over either backend: the in-process one, or a
//! vfio-user client connected to a server (on a thread of this process)
//! that serves the same device model. The model and its bus stay reachable
//! either way, for fault injection and leak checks.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use mlx5_emu::{Device, DeviceConfig};
use vfio::emulated::{Bus, DeviceModel};
use vfio::user::{Server, ServerThread, VfioUserFunction};
use vfio::PciFunction;

/// Which backend the driver runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// `vfio::emulated`: the model in this process, called directly.
    InProcess,
    /// `vfio::user`: the model behind a vfio-user socket.
    VfioUser,
}

/// A device-model function as the driver sees it, plus the model.
#[derive(Debug)]
pub struct Func {
    func: Arc<dyn PciFunction>,
    model: Arc<Device>,
    bus: Bus,
    // Declared last: the client hangs up before the server stops.
    _server: Option<ServerThread>,
}

impl Func {
    /// The driver's handle.
    pub fn function(&self) -> Arc<dyn PciFunction> {
        self.func.clone()
    }

    /// The model, to steer and inspect it.
    pub fn model(&self) -> &Arc<Device> {
        &self.model
    }

    /// The model's bus (what the device side holds: mappings, eventfds).
    pub fn bus(&self) -> &Bus {
        &self.bus
    }
}

impl std::ops::Deref for Func {
    type Target = dyn PciFunction;
    fn deref(&self) -> &Self::Target {
        &*self.func
    }
}

/// A fresh socket path under the temp directory, unique in this process.
pub fn socket_path(tag: &str) -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    std::env::temp_dir().join(format!(
        "mlx5-{tag}-{}-{}.sock",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ))
}

/// A model built as `config` says, served on a fresh socket.
pub fn serve(config: DeviceConfig) -> (Arc<Device>, Bus, ServerThread) {
    let bus = Bus::new();
    let model = Arc::new(Device::new(config, bus.clone()));
    let dyn_model: Arc<dyn DeviceModel> = model.clone();
    let server = Server::bind(socket_path("vu"), dyn_model, bus.clone())
        .unwrap_or_else(|e| panic!("binding a vfio-user socket: {e}"));
    let thread = server
        .spawn()
        .unwrap_or_else(|e| panic!("starting the server: {e}"));
    (model, bus, thread)
}

/// A function of a model built as `config` says, over `backend`.
///
/// # Panics
/// If the function cannot be made (tests want that loud).
pub fn device(backend: Backend, config: DeviceConfig) -> Func {
    match backend {
        Backend::InProcess => {
            let f = Arc::new(mlx5_emu::emulated_with(config));
            Func {
                model: f.model().clone(),
                bus: f.bus().clone(),
                func: f,
                _server: None,
            }
        }
        Backend::VfioUser => {
            let (model, bus, server) = serve(config);
            let client = VfioUserFunction::connect(server.path())
                .unwrap_or_else(|e| panic!("connecting: {e}"));
            Func {
                func: Arc::new(client),
                model,
                bus,
                _server: Some(server),
            }
        }
    }
}
