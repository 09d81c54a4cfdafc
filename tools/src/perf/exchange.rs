//! The out-of-band exchange over TCP, as perftest does it without
//! rdma_cm: the client connects to the server's port (18515), each side
//! sends every QP's address as perftest's 108-byte `KEY_PRINT_FMT_GID`
//! text (`LID:OUT_READS:QPN:PSN:RKEY:VADDR:GID bytes:SRQN:`, hex), client
//! first; later the sides synchronise with messages of the same size.

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

/// How often a side waiting for its peer checks its own device.
pub const WATCH_SLICE: Duration = Duration::from_millis(100);

/// perftest's `KEY_MSG_SIZE_GID`: every message on the socket.
pub const MSG_SIZE: usize = 108;

/// One QP's address (perftest's `struct pingpong_dest`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Dest {
    /// LID (0 on Ethernet).
    pub lid: u16,
    /// Outstanding reads.
    pub out_reads: u16,
    /// QP number.
    pub qpn: u32,
    /// Initial PSN.
    pub psn: u32,
    /// Remote key of the buffer.
    pub rkey: u32,
    /// Virtual address of the buffer.
    pub vaddr: u64,
    /// GID.
    pub gid: [u8; 16],
    /// SRQ number (XRC/DC; 0 here).
    pub srqn: u32,
}

impl Dest {
    /// The wire text, NUL-padded to [`MSG_SIZE`].
    pub fn encode(&self) -> [u8; MSG_SIZE] {
        let mut s = format!(
            "{:04x}:{:04x}:{:06x}:{:06x}:{:08x}:{:016x}:",
            self.lid, self.out_reads, self.qpn, self.psn, self.rkey, self.vaddr
        );
        for b in self.gid {
            s.push_str(&format!("{b:02x}:"));
        }
        s.push_str(&format!("{:08x}:", self.srqn));
        let mut out = [0u8; MSG_SIZE];
        let n = s.len().min(MSG_SIZE - 1);
        out[..n].copy_from_slice(&s.as_bytes()[..n]);
        out
    }

    /// Parses what a peer sent.
    pub fn decode(msg: &[u8]) -> Result<Self, String> {
        let end = msg.iter().position(|&b| b == 0).unwrap_or(msg.len());
        let text = std::str::from_utf8(&msg[..end])
            .map_err(|_| "peer's address message is not text".to_string())?;
        let f: Vec<&str> = text.split(':').collect();
        if f.len() < 23 {
            return Err(format!(
                "peer's address message has {} fields: {text:?}",
                f.len()
            ));
        }
        let hex = |i: usize| {
            u64::from_str_radix(f[i], 16)
                .map_err(|_| format!("peer's address field {i} is not hex: {:?}", f[i]))
        };
        let mut gid = [0u8; 16];
        for (k, g) in gid.iter_mut().enumerate() {
            *g = hex(6 + k)? as u8;
        }
        Ok(Self {
            lid: hex(0)? as u16,
            out_reads: hex(1)? as u16,
            qpn: (hex(2)? & 0xff_ffff) as u32,
            psn: (hex(3)? & 0xff_ffff) as u32,
            rkey: hex(4)? as u32,
            vaddr: hex(5)?,
            gid,
            srqn: hex(22)? as u32,
        })
    }
}

/// The control connection to the peer.
#[derive(Debug)]
pub struct Ctl {
    sock: TcpStream,
    /// This side is the client.
    pub client: bool,
    peer_done: bool,
}

/// Binds the server's socket (`0.0.0.0:port`; port 0: any).
pub fn listen(addr: &str, port: u16) -> Result<TcpListener, String> {
    TcpListener::bind((addr, port)).map_err(|e| format!("bind {addr}:{port}: {e}"))
}

impl Ctl {
    /// Waits for one client on `l`.
    pub fn accept(l: &TcpListener) -> Result<Self, String> {
        let (sock, _) = l.accept().map_err(|e| format!("accept: {e}"))?;
        sock.set_nodelay(true).ok();
        Ok(Self {
            sock,
            client: false,
            peer_done: false,
        })
    }

    /// Connects to the server (retrying for 10 s while it is not up yet).
    pub fn connect(host: &str, port: u16) -> Result<Self, String> {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            match TcpStream::connect((host, port)) {
                Ok(sock) => {
                    sock.set_nodelay(true).ok();
                    return Ok(Self {
                        sock,
                        client: true,
                        peer_done: false,
                    });
                }
                Err(e) if std::time::Instant::now() >= deadline => {
                    return Err(format!("connect {host}:{port}: {e}"))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    fn send(&mut self, m: &[u8; MSG_SIZE]) -> Result<(), String> {
        self.sock
            .write_all(m)
            .map_err(|e| format!("send to peer: {e}"))
    }

    fn recv(&mut self) -> Result<[u8; MSG_SIZE], String> {
        let mut m = [0u8; MSG_SIZE];
        self.sock.set_nonblocking(false).ok();
        self.sock
            .read_exact(&mut m)
            .map_err(|e| format!("receive from peer: {e}"))?;
        Ok(m)
    }

    /// Sends ours and receives theirs (client first, as perftest).
    pub fn exchange(&mut self, mine: &[u8; MSG_SIZE]) -> Result<[u8; MSG_SIZE], String> {
        if self.client {
            self.send(mine)?;
            self.recv()
        } else {
            let t = self.recv()?;
            self.send(mine)?;
            Ok(t)
        }
    }

    /// Exchanges every QP's address.
    pub fn exchange_dests(&mut self, mine: &[Dest]) -> Result<Vec<Dest>, String> {
        mine.iter()
            .map(|d| Dest::decode(&self.exchange(&d.encode())?))
            .collect()
    }

    /// A text message (at most 107 bytes).
    pub fn exchange_text(&mut self, text: &str) -> Result<String, String> {
        let mut m = [0u8; MSG_SIZE];
        let n = text.len().min(MSG_SIZE - 1);
        m[..n].copy_from_slice(&text.as_bytes()[..n]);
        let t = self.exchange(&m)?;
        let end = t.iter().position(|&b| b == 0).unwrap_or(MSG_SIZE);
        Ok(String::from_utf8_lossy(&t[..end]).into_owned())
    }

    /// Both sides reached the same point (perftest's `ctx_hand_shake`).
    pub fn sync(&mut self) -> Result<(), String> {
        let got = self.exchange_text("sync")?;
        if got == "sync" || got == "done" {
            Ok(())
        } else {
            Err(format!("peer out of step: {got:?}"))
        }
    }

    /// Tells the peer this side has finished a duration run.
    pub fn send_done(&mut self) -> Result<(), String> {
        let mut m = [0u8; MSG_SIZE];
        m[..4].copy_from_slice(b"done");
        self.send(&m)
    }

    /// Whether the peer said [`Ctl::send_done`] (non-blocking; consumes it).
    pub fn peer_done(&mut self) -> bool {
        if self.peer_done {
            return true;
        }
        self.sock.set_nonblocking(true).ok();
        let mut m = [0u8; MSG_SIZE];
        let r = self.sock.peek(&mut m);
        self.sock.set_nonblocking(false).ok();
        match r {
            Ok(n) if n >= MSG_SIZE => {
                let _ = self.sock.read_exact(&mut m);
                self.peer_done = true;
            }
            Ok(0) => self.peer_done = true,
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(_) => self.peer_done = true,
        }
        self.peer_done
    }

    /// Waits for the peer's "done" if it has not come yet.
    pub fn wait_peer_done(&mut self) -> Result<(), String> {
        if !self.peer_done {
            self.recv()?;
            self.peer_done = true;
        }
        Ok(())
    }

    /// [`Ctl::wait_peer_done`], checking `watch` (this side's device)
    /// every [`WATCH_SLICE`] meanwhile: a side that only waits for its peer
    /// still ends with its own device's failure.
    pub fn wait_peer_done_watching(
        &mut self,
        watch: &mut dyn FnMut() -> Result<(), String>,
    ) -> Result<(), String> {
        let mut b = [0u8; 1];
        while !self.peer_done() {
            watch()?;
            // Wait for data (or a hang-up) for one slice.
            self.sock.set_read_timeout(Some(WATCH_SLICE)).ok();
            let r = self.sock.peek(&mut b);
            self.sock.set_read_timeout(None).ok();
            match r {
                Ok(_) => {}
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(format!("receive from peer: {e}")),
            }
        }
        Ok(())
    }

    /// Clears the "done" state for the next round.
    pub fn reset_done(&mut self) {
        self.peer_done = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dest_round_trips_in_perftest_format() {
        let d = Dest {
            lid: 0,
            out_reads: 16,
            qpn: 0x108,
            psn: 0xabcdef,
            rkey: 0x1200,
            vaddr: 0x7f00_1234_5000,
            gid: [
                0xfe, 0x80, 0, 0, 0, 0, 0, 0, 2, 2, 0xc9, 0xff, 0xfe, 0, 0, 1,
            ],
            srqn: 0,
        };
        let m = d.encode();
        let text = std::str::from_utf8(&m[..107]).unwrap();
        assert!(text.starts_with("0000:0010:000108:abcdef:00001200:00007f0012345000:fe:80:"));
        assert!(text.ends_with(":00000000:"));
        assert_eq!(m[107], 0);
        assert_eq!(Dest::decode(&m).unwrap(), d);
        assert!(Dest::decode(b"1:2:3").is_err());
    }
}
