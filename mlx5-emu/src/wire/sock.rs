//! The sockets a port's wire runs over, in QEMU's two netdev formats:
//! `dgram` (one Ethernet frame per datagram, UDP or a Unix datagram
//! socket) and `stream` (TCP or a Unix stream socket, each frame preceded
//! by its length, 4 bytes big-endian). Addresses are loopback or Unix
//! socket paths only: the wire never leaves the machine.

use std::io::{self, ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::unix::net::{UnixDatagram, UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use crate::lock;

/// How long a receive waits before the link looks at its held frames
/// and its stop flag.
pub(crate) const TICK: Duration = Duration::from_millis(2);
/// How long a send on a stream may block before the connection is
/// given up (the peer stopped reading).
const SEND_TIMEOUT: Duration = Duration::from_secs(2);

/// One end's address: loopback IP and port, or a Unix socket path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Addr {
    /// A loopback address and port.
    Inet(SocketAddr),
    /// A Unix socket path.
    Unix(PathBuf),
}

impl Addr {
    /// `HOST:PORT` (loopback only) or a path (anything with a `/`).
    pub fn parse(s: &str) -> Result<Self, String> {
        if s.contains('/') {
            return Ok(Self::Unix(PathBuf::from(s)));
        }
        let a: SocketAddr = s
            .parse()
            .map_err(|_| format!("{s:?}: neither HOST:PORT nor a socket path"))?;
        if !a.ip().is_loopback() {
            return Err(format!(
                "{s:?}: the wire takes loopback addresses or Unix socket paths only"
            ));
        }
        Ok(Self::Inet(a))
    }
}

impl std::fmt::Display for Addr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Addr::Inet(a) => write!(f, "{a}"),
            Addr::Unix(p) => write!(f, "{}", p.display()),
        }
    }
}

/// Which socket a port's wire runs over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkSpec {
    /// One frame per datagram, from `local` to `remote`.
    Dgram {
        /// This end (bound).
        local: Addr,
        /// The other end.
        remote: Addr,
    },
    /// Length-prefixed frames on a stream: listening at `addr` (server)
    /// or connecting to it.
    Stream {
        /// Listen (true) or connect.
        server: bool,
        /// The address.
        addr: Addr,
    },
}

impl LinkSpec {
    /// `dgram,local=A,remote=B`, `stream,server=on,addr=A` or
    /// `stream,addr=A` (QEMU's netdev keys, flattened).
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut parts = s.split(',');
        let kind = parts.next().unwrap_or_default();
        let (mut local, mut remote, mut addr, mut server) = (None, None, None, false);
        for kv in parts {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| format!("wire {kv:?}: not key=value"))?;
            match k {
                "local" => local = Some(Addr::parse(v)?),
                "remote" => remote = Some(Addr::parse(v)?),
                "addr" => addr = Some(Addr::parse(v)?),
                "server" => server = matches!(v, "on" | "true" | "1"),
                _ => {
                    return Err(format!(
                        "wire key {k:?}: unknown (local, remote, addr, server)"
                    ))
                }
            }
        }
        match kind {
            "dgram" => match (local, remote) {
                (Some(local), Some(remote)) => Ok(Self::Dgram { local, remote }),
                _ => Err("dgram needs local= and remote=".into()),
            },
            "stream" => addr
                .map(|addr| Self::Stream { server, addr })
                .ok_or_else(|| "stream needs addr=".into()),
            _ => Err(format!("wire {kind:?}: dgram or stream")),
        }
    }
}

impl std::fmt::Display for LinkSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LinkSpec::Dgram { local, remote } => write!(f, "dgram,local={local},remote={remote}"),
            LinkSpec::Stream { server, addr } => write!(
                f,
                "stream,{}addr={addr}",
                if *server { "server=on," } else { "" }
            ),
        }
    }
}

#[derive(Debug)]
enum Dgram {
    Udp(UdpSocket, SocketAddr),
    Unix(UnixDatagram, PathBuf),
}

#[derive(Debug)]
enum Conn {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Conn {
    fn try_clone(&self) -> io::Result<Self> {
        Ok(match self {
            Conn::Tcp(s) => Conn::Tcp(s.try_clone()?),
            Conn::Unix(s) => Conn::Unix(s.try_clone()?),
        })
    }

    fn setup(&self) -> io::Result<()> {
        match self {
            Conn::Tcp(s) => {
                s.set_nodelay(true)?;
                s.set_read_timeout(Some(TICK))?;
                s.set_write_timeout(Some(SEND_TIMEOUT))
            }
            Conn::Unix(s) => {
                s.set_read_timeout(Some(TICK))?;
                s.set_write_timeout(Some(SEND_TIMEOUT))
            }
        }
    }

    fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
        match self {
            Conn::Tcp(s) => s.read(b),
            Conn::Unix(s) => s.read(b),
        }
    }

    fn write_all(&mut self, b: &[u8]) -> io::Result<()> {
        match self {
            Conn::Tcp(s) => s.write_all(b),
            Conn::Unix(s) => s.write_all(b),
        }
    }

    fn shutdown(&self) {
        let _ = match self {
            Conn::Tcp(s) => s.shutdown(std::net::Shutdown::Both),
            Conn::Unix(s) => s.shutdown(std::net::Shutdown::Both),
        };
    }
}

#[derive(Debug)]
enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener, PathBuf),
}

/// A stream's receive state: the length word, then the frame (or, for a
/// length over the limit, the bytes to skip).
#[derive(Debug, Default)]
struct StreamRx {
    len: [u8; 4],
    have_len: usize,
    frame: Vec<u8>,
    want: usize,
    skip: usize,
}

/// The socket side of a link.
#[derive(Debug)]
pub(crate) struct Endpoint {
    kind: Kind,
}

#[derive(Debug)]
enum Kind {
    Dgram(Dgram),
    Stream {
        spec_addr: Addr,
        listener: Option<Listener>,
        /// The writer half of the connection, if one is up.
        tx: Mutex<Option<Conn>>,
        /// The reader half (the receive thread's).
        rx: Mutex<Option<(Conn, StreamRx)>>,
    },
}

/// What one receive gave.
#[derive(Debug)]
pub(crate) enum Rx {
    /// A frame of this many bytes (in the buffer).
    Frame(usize),
    /// A frame over `max` bytes, dropped.
    Giant(usize),
    /// Nothing this tick.
    Idle,
    /// The peer closed the stream (a frame cut short counts as truncated).
    Closed { truncated: bool },
}

impl Endpoint {
    /// Binds or listens; a stream client connects later (on receive).
    pub(crate) fn open(spec: &LinkSpec) -> io::Result<Self> {
        let kind = match spec {
            LinkSpec::Dgram { local, remote } => Kind::Dgram(match (local, remote) {
                (Addr::Inet(l), Addr::Inet(r)) => {
                    let s = UdpSocket::bind(l)?;
                    s.set_read_timeout(Some(TICK))?;
                    Dgram::Udp(s, *r)
                }
                (Addr::Unix(l), Addr::Unix(r)) => {
                    let _ = std::fs::remove_file(l);
                    let s = UnixDatagram::bind(l)?;
                    s.set_read_timeout(Some(TICK))?;
                    Dgram::Unix(s, r.clone())
                }
                _ => {
                    return Err(io::Error::new(
                        ErrorKind::InvalidInput,
                        "dgram: local and remote must both be IP or both Unix paths",
                    ))
                }
            }),
            LinkSpec::Stream { server, addr } => {
                let listener = if *server {
                    Some(match addr {
                        Addr::Inet(a) => {
                            let l = TcpListener::bind(a)?;
                            l.set_nonblocking(true)?;
                            Listener::Tcp(l)
                        }
                        Addr::Unix(p) => {
                            let _ = std::fs::remove_file(p);
                            let l = UnixListener::bind(p)?;
                            l.set_nonblocking(true)?;
                            Listener::Unix(l, p.clone())
                        }
                    })
                } else {
                    None
                };
                Kind::Stream {
                    spec_addr: addr.clone(),
                    listener,
                    tx: Mutex::new(None),
                    rx: Mutex::new(None),
                }
            }
        };
        Ok(Self { kind })
    }

    /// The bound local address of a UDP or TCP-server end (for port 0).
    pub(crate) fn local_addr(&self) -> Option<SocketAddr> {
        match &self.kind {
            Kind::Dgram(Dgram::Udp(s, _)) => s.local_addr().ok(),
            Kind::Stream {
                listener: Some(Listener::Tcp(l)),
                ..
            } => l.local_addr().ok(),
            _ => None,
        }
    }

    /// Sends one frame; an error means it was not sent (no connection, the
    /// peer gone or not reading).
    pub(crate) fn send(&self, f: &[u8]) -> io::Result<()> {
        match &self.kind {
            Kind::Dgram(Dgram::Udp(s, to)) => s.send_to(f, to).map(drop),
            Kind::Dgram(Dgram::Unix(s, to)) => s.send_to(f, to).map(drop),
            Kind::Stream { tx, .. } => {
                let mut g = lock(tx);
                let Some(c) = g.as_mut() else {
                    return Err(io::Error::new(ErrorKind::NotConnected, "no peer connected"));
                };
                let mut b = Vec::with_capacity(4 + f.len());
                b.extend_from_slice(&(f.len() as u32).to_be_bytes());
                b.extend_from_slice(f);
                let r = c.write_all(&b);
                if r.is_err() {
                    // A partial write leaves the stream out of step: the
                    // connection is given up.
                    c.shutdown();
                    *g = None;
                }
                r
            }
        }
    }

    /// Receives at most one frame into `buf` (frames over `buf.len()` are
    /// dropped as giants), waiting at most a tick.
    pub(crate) fn recv(&self, buf: &mut [u8]) -> io::Result<Rx> {
        match &self.kind {
            Kind::Dgram(d) => {
                // One byte more than the largest frame tells a giant.
                let r = match d {
                    Dgram::Udp(s, _) => s.recv_from(buf).map(|(n, _)| n),
                    Dgram::Unix(s, _) => s.recv_from(buf).map(|(n, _)| n),
                };
                match r {
                    Ok(n) if n >= buf.len() => Ok(Rx::Giant(n)),
                    Ok(n) => Ok(Rx::Frame(n)),
                    Err(e) if is_timeout(&e) => Ok(Rx::Idle),
                    // A UDP send to a port nobody listens on comes back as
                    // ECONNREFUSED on a later receive: nothing received.
                    Err(e) if e.kind() == ErrorKind::ConnectionRefused => Ok(Rx::Idle),
                    Err(e) => Err(e),
                }
            }
            Kind::Stream {
                spec_addr,
                listener,
                tx,
                rx,
            } => {
                let mut g = lock(rx);
                if g.is_none() {
                    let Some(c) = connect(spec_addr, listener.as_ref())? else {
                        std::thread::sleep(TICK);
                        return Ok(Rx::Idle);
                    };
                    c.setup()?;
                    *lock(tx) = Some(c.try_clone()?);
                    *g = Some((c, StreamRx::default()));
                }
                let Some((c, st)) = g.as_mut() else {
                    return Ok(Rx::Idle);
                };
                let r = stream_recv(c, st, buf);
                if let Ok(Rx::Closed { .. }) = r {
                    *g = None;
                    if let Some(t) = lock(tx).take() {
                        t.shutdown();
                    }
                }
                r
            }
        }
    }

    /// Closes the connection, if a stream has one (the peer sees EOF).
    pub(crate) fn close(&self) {
        if let Kind::Stream { tx, rx, .. } = &self.kind {
            if let Some(t) = lock(tx).take() {
                t.shutdown();
            }
            lock(rx).take();
        }
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.close();
        if let Kind::Stream {
            listener: Some(Listener::Unix(_, p)),
            ..
        } = &self.kind
        {
            let _ = std::fs::remove_file(p);
        }
        if let Kind::Dgram(Dgram::Unix(s, _)) = &self.kind {
            if let Some(p) = s
                .local_addr()
                .ok()
                .and_then(|a| a.as_pathname().map(|p| p.to_owned()))
            {
                let _ = std::fs::remove_file(p);
            }
        }
    }
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
}

/// A new connection: accepted (server) or made (client); `None` for none
/// yet.
fn connect(addr: &Addr, listener: Option<&Listener>) -> io::Result<Option<Conn>> {
    let r = match (listener, addr) {
        (Some(Listener::Tcp(l)), _) => l.accept().map(|(s, _)| {
            let _ = s.set_nonblocking(false);
            Conn::Tcp(s)
        }),
        (Some(Listener::Unix(l, _)), _) => l.accept().map(|(s, _)| {
            let _ = s.set_nonblocking(false);
            Conn::Unix(s)
        }),
        (None, Addr::Inet(a)) => TcpStream::connect_timeout(a, TICK * 10).map(Conn::Tcp),
        (None, Addr::Unix(p)) => UnixStream::connect(p).map(Conn::Unix),
    };
    match r {
        Ok(c) => {
            tracing::info!(peer = %addr, "wire connected");
            Ok(Some(c))
        }
        Err(e)
            if is_timeout(&e)
                || matches!(
                    e.kind(),
                    ErrorKind::ConnectionRefused
                        | ErrorKind::NotFound
                        | ErrorKind::AddrNotAvailable
                ) =>
        {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// Reads what the stream has (at most one frame), keeping partial reads
/// in `st` across ticks.
fn stream_recv(c: &mut Conn, st: &mut StreamRx, buf: &mut [u8]) -> io::Result<Rx> {
    loop {
        if st.skip > 0 {
            let mut sink = [0u8; 4096];
            let n = st.skip.min(sink.len());
            match c.read(&mut sink[..n]) {
                Ok(0) => return Ok(Rx::Closed { truncated: true }),
                Ok(k) => st.skip -= k,
                Err(e) if is_timeout(&e) => return Ok(Rx::Idle),
                Err(e) => return Err(e),
            }
            continue;
        }
        if st.have_len < 4 {
            match c.read(&mut st.len[st.have_len..]) {
                Ok(0) => {
                    return Ok(Rx::Closed {
                        truncated: st.have_len != 0,
                    })
                }
                Ok(k) => st.have_len += k,
                Err(e) if is_timeout(&e) => return Ok(Rx::Idle),
                Err(e) => return Err(e),
            }
            if st.have_len < 4 {
                continue;
            }
            let len = u32::from_be_bytes(st.len) as usize;
            if len >= buf.len() {
                // Skipped without storing it: memory stays bounded.
                st.have_len = 0;
                st.skip = len;
                return Ok(Rx::Giant(len));
            }
            st.want = len;
            st.frame.clear();
        }
        if st.frame.len() < st.want {
            let at = st.frame.len();
            st.frame.resize(st.want, 0);
            match c.read(&mut st.frame[at..]) {
                Ok(0) => {
                    st.frame.truncate(at);
                    return Ok(Rx::Closed { truncated: true });
                }
                Ok(k) => st.frame.truncate(at + k),
                Err(e) if is_timeout(&e) => {
                    st.frame.truncate(at);
                    return Ok(Rx::Idle);
                }
                Err(e) => {
                    st.frame.truncate(at);
                    return Err(e);
                }
            }
            if st.frame.len() < st.want {
                continue;
            }
        }
        let n = st.want;
        buf[..n].copy_from_slice(&st.frame);
        st.have_len = 0;
        st.want = 0;
        st.frame.clear();
        return Ok(Rx::Frame(n));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_refuse() {
        assert_eq!(
            LinkSpec::parse("dgram,local=127.0.0.1:5000,remote=127.0.0.1:5001").unwrap(),
            LinkSpec::Dgram {
                local: Addr::Inet("127.0.0.1:5000".parse().unwrap()),
                remote: Addr::Inet("127.0.0.1:5001".parse().unwrap()),
            }
        );
        assert_eq!(
            LinkSpec::parse("stream,server=on,addr=/tmp/x.sock").unwrap(),
            LinkSpec::Stream {
                server: true,
                addr: Addr::Unix("/tmp/x.sock".into())
            }
        );
        for bad in [
            "dgram,local=10.0.0.1:5,remote=127.0.0.1:6",
            "stream,addr=192.168.1.1:80",
            "stream",
            "dgram,local=127.0.0.1:5",
            "tap,ifname=x",
            "stream,addr=localhost",
            "stream,bogus=1,addr=/x",
        ] {
            assert!(LinkSpec::parse(bad).is_err(), "{bad}");
        }
        let s = "stream,server=on,addr=127.0.0.1:7000";
        assert_eq!(LinkSpec::parse(s).unwrap().to_string(), s);
    }
}
