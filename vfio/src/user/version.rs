//! `VFIO_USER_VERSION`: the first message of a session. Both sides send
//! `major`, `minor` and a NUL-terminated JSON object of capabilities; the
//! server answers with the same major, a minor no higher than the client's,
//! and its own limits.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// The protocol major version spoken here.
pub const MAJOR: u16 = 0;
/// The protocol minor version spoken here.
pub const MINOR: u16 = 1;

/// The fixed part of the payload.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
#[repr(C)]
pub struct Version {
    /// Major version (must match).
    pub major: u16,
    /// Minor version.
    pub minor: u16,
}

/// The capabilities a side announces (the specification's defaults for
/// anything absent).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// Most fds the sender accepts in one message (default 1).
    pub max_msg_fds: u32,
    /// Most bytes one REGION/DMA read or write may carry (default 1 MiB).
    pub max_data_xfer_size: u32,
    /// Most DMA mappings at once (default 65535).
    pub max_dma_maps: u32,
    /// Page sizes DMA_MAP accepts, ORed (default 4 KiB).
    pub pgsizes: u64,
}

impl Default for Capabilities {
    fn default() -> Self {
        Self {
            max_msg_fds: 1,
            max_data_xfer_size: 1 << 20,
            max_dma_maps: 65535,
            pgsizes: 4096,
        }
    }
}

impl Capabilities {
    /// The JSON text (NUL-terminated, as sent).
    pub fn to_wire(&self) -> Vec<u8> {
        let v = serde_json::json!({
            "capabilities": {
                "max_msg_fds": self.max_msg_fds,
                "max_data_xfer_size": self.max_data_xfer_size,
                "max_dma_maps": self.max_dma_maps,
                "pgsizes": self.pgsizes,
            }
        });
        let mut b = v.to_string().into_bytes();
        b.push(0);
        b
    }

    /// Parses the version data after the fixed part (empty: all defaults).
    /// Unknown capabilities are ignored; a malformed text or a value of the
    /// wrong type is an error.
    pub fn from_wire(data: &[u8]) -> Result<Self, String> {
        let text = data.split(|&b| b == 0).next().unwrap_or(&[]);
        let mut caps = Self::default();
        if text.iter().all(u8::is_ascii_whitespace) {
            return Ok(caps);
        }
        let v: serde_json::Value =
            serde_json::from_slice(text).map_err(|e| format!("version data is not JSON: {e}"))?;
        let Some(c) = v.get("capabilities") else {
            return Ok(caps);
        };
        let num = |name: &str| -> Result<Option<u64>, String> {
            match c.get(name) {
                None => Ok(None),
                Some(x) => x
                    .as_u64()
                    .map(Some)
                    .ok_or_else(|| format!("capability {name} is not a number: {x}")),
            }
        };
        let small = |name: &str, x: u64| -> Result<u32, String> {
            u32::try_from(x).map_err(|_| format!("capability {name} = {x} is out of range"))
        };
        if let Some(x) = num("max_msg_fds")? {
            caps.max_msg_fds = small("max_msg_fds", x)?;
        }
        if let Some(x) = num("max_data_xfer_size")? {
            caps.max_data_xfer_size = small("max_data_xfer_size", x)?;
        }
        if let Some(x) = num("max_dma_maps")? {
            caps.max_dma_maps = small("max_dma_maps", x)?;
        }
        if let Some(x) = num("pgsizes")? {
            caps.pgsizes = x;
        }
        Ok(caps)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capabilities_round_trip_and_defaults() {
        let c = Capabilities {
            max_msg_fds: 64,
            max_data_xfer_size: 4096,
            max_dma_maps: 10,
            pgsizes: 4096 | (2 << 20),
        };
        let w = c.to_wire();
        assert_eq!(w.last(), Some(&0));
        assert_eq!(Capabilities::from_wire(&w).unwrap(), c);
        assert_eq!(
            Capabilities::from_wire(b"").unwrap(),
            Capabilities::default()
        );
        assert_eq!(
            Capabilities::from_wire(b"{\"capabilities\":{\"migration\":{\"pgsize\":4096}}}\0")
                .unwrap(),
            Capabilities::default()
        );
        assert!(Capabilities::from_wire(b"{not json").is_err());
        assert!(Capabilities::from_wire(b"{\"capabilities\":{\"max_msg_fds\":\"x\"}}").is_err());
    }
}
