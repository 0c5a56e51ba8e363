//! The guest's network: `lo` up, `eth0` at the fixed sandbox address (169.254.0.21/30, the same
//! in every network slot, so a snapshot restores into any slot), default route through the
//! slot's gateway 169.254.0.22. Classic ioctls keep the init free of netlink code.

use std::net::Ipv4Addr;

const SANDBOX_ADDR: Ipv4Addr = Ipv4Addr::new(169, 254, 0, 21);
const NETMASK: Ipv4Addr = Ipv4Addr::new(255, 255, 255, 252);
const GATEWAY: Ipv4Addr = Ipv4Addr::new(169, 254, 0, 22);

pub fn configure() -> Result<(), String> {
    let sock = Socket::new()?;
    sock.up("lo")?;
    sock.set_addr("eth0", libc::SIOCSIFADDR, SANDBOX_ADDR)?;
    sock.set_addr("eth0", libc::SIOCSIFNETMASK, NETMASK)?;
    sock.up("eth0")?;
    sock.default_route(GATEWAY)
}

struct Socket(libc::c_int);

fn sockaddr(addr: Ipv4Addr) -> libc::sockaddr {
    let sin = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from(addr).to_be(),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: sockaddr_in and sockaddr have the same size (16 bytes) and sockaddr has no
    // invalid bit patterns; this is the documented way to pass an IPv4 address to these ioctls.
    unsafe { std::mem::transmute::<libc::sockaddr_in, libc::sockaddr>(sin) }
}

fn ifreq(name: &str) -> Result<libc::ifreq, String> {
    // SAFETY: ifreq is plain old data; all zeroes is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    if name.len() >= req.ifr_name.len() {
        return Err(format!("interface name {name} too long"));
    }
    for (dst, src) in req.ifr_name.iter_mut().zip(name.bytes()) {
        *dst = src as libc::c_char;
    }
    Ok(req)
}

impl Socket {
    fn new() -> Result<Self, String> {
        // SAFETY: plain socket(2) call; the descriptor is owned by the returned value.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(format!("socket: {}", std::io::Error::last_os_error()));
        }
        Ok(Self(fd))
    }

    fn ioctl<T>(&self, what: &str, request: libc::c_ulong, arg: &mut T) -> Result<(), String> {
        // SAFETY: `arg` is the structure the request expects (ifreq or rtentry), valid and
        // exclusively borrowed for the duration of the call.
        let rc = unsafe { libc::ioctl(self.0, request as _, arg as *mut T) };
        if rc != 0 {
            return Err(format!("{what}: {}", std::io::Error::last_os_error()));
        }
        Ok(())
    }

    fn set_addr(&self, iface: &str, request: libc::c_ulong, addr: Ipv4Addr) -> Result<(), String> {
        let mut req = ifreq(iface)?;
        req.ifr_ifru.ifru_addr = sockaddr(addr);
        self.ioctl(&format!("set {addr} on {iface}"), request, &mut req)
    }

    fn up(&self, iface: &str) -> Result<(), String> {
        let mut req = ifreq(iface)?;
        self.ioctl(&format!("flags of {iface}"), libc::SIOCGIFFLAGS, &mut req)?;
        // SAFETY: SIOCGIFFLAGS filled the flags member of the union.
        let flags = unsafe { req.ifr_ifru.ifru_flags };
        req.ifr_ifru.ifru_flags = flags | (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
        self.ioctl(&format!("bring {iface} up"), libc::SIOCSIFFLAGS, &mut req)
    }

    fn default_route(&self, gateway: Ipv4Addr) -> Result<(), String> {
        // SAFETY: rtentry is plain old data; all zeroes is a valid value (null rt_dev: any
        // interface that reaches the gateway).
        let mut rt: libc::rtentry = unsafe { std::mem::zeroed() };
        rt.rt_dst = sockaddr(Ipv4Addr::UNSPECIFIED);
        rt.rt_genmask = sockaddr(Ipv4Addr::UNSPECIFIED);
        rt.rt_gateway = sockaddr(gateway);
        rt.rt_flags = libc::RTF_UP | libc::RTF_GATEWAY;
        self.ioctl("add the default route", libc::SIOCADDRT, &mut rt)
    }
}

impl Drop for Socket {
    fn drop(&mut self) {
        // SAFETY: we own the descriptor and close it once.
        unsafe { libc::close(self.0) };
    }
}
