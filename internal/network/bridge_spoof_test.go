package network

import (
	"bytes"
	"context"
	"encoding/binary"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/useshards/shard/internal/testenv"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// rawSocket opens an AF_PACKET socket on eth0 of the namespace at ns, as a
// sandbox with CAP_NET_RAW (runc's) can; it returns the socket and eth0's
// index.
func rawSocket(t *testing.T, ns string) (fd, ifindex int) {
	t.Helper()
	err := inNetns(ns, func() error {
		eth, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		ifindex = eth.Attrs().Index
		if fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ALL))); err != nil {
			return err
		}
		return unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifindex})
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return fd, ifindex
}

// ipv4Frame is an Ethernet frame from srcMAC to dstMAC holding a bare IPv4
// header from src to dst: enough for the bridge to learn from, and for the
// anti-spoofing rules to let through (the address is the sender's own).
func ipv4Frame(dstMAC, srcMAC net.HardwareAddr, src, dst netip.Addr) []byte {
	ip := make([]byte, 20)
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], 20)
	ip[8] = 64
	ip[9] = unix.IPPROTO_UDP
	copy(ip[12:], src.AsSlice())
	copy(ip[16:], dst.AsSlice())
	var sum uint32
	for i := 0; i < 20; i += 2 {
		sum += uint32(binary.BigEndian.Uint16(ip[i:]))
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	binary.BigEndian.PutUint16(ip[10:], ^uint16(sum))
	f := append(append(append([]byte{}, dstMAC...), srcMAC...), 0x08, 0x00)
	return append(f, ip...)
}

// TestBridgeMACSpoof: a sandbox sending frames from a neighbour's MAC
// (from its own address, which the anti-spoofing rules let through) does
// not get the host's frames for that neighbour: the bridge learns nothing
// from sandbox ports, each port's MAC is a static entry.
func TestBridgeMACSpoof(t *testing.T) {
	testenv.RequireRoot(t, "network namespaces, a bridge and nftables")
	const br = "shmacsp0"
	ctx := context.Background()
	m := testManager(t, br, "10.97.0.0/24", hostVeth("macsp-a"), hostVeth("macsp-b"))
	if err := m.Open(); err != nil {
		t.Fatal(err)
	}
	a, b := netip.MustParseAddr("10.97.0.2"), netip.MustParseAddr("10.97.0.3")
	nsA, err := m.Create(ctx, "macsp-a", a)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Delete("macsp-a") })
	nsB, err := m.Create(ctx, "macsp-b", b)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Delete("macsp-b") })
	macB := eth0(t, nsB).HardwareAddr
	bridge, err := netlink.LinkByName(br)
	if err != nil {
		t.Fatal(err)
	}
	send := func(port int, msg string) {
		t.Helper()
		c, err := net.Dial("udp4", netip.AddrPortFrom(b, uint16(port)).String())
		if err != nil {
			t.Fatal(err)
		}
		c.Write([]byte(msg))
		c.Close()
	}
	send(9, "warm-up") // the host knows B's MAC
	time.Sleep(200 * time.Millisecond)

	fd, ifindex := rawSocket(t, nsA)
	frame := ipv4Frame(bridge.Attrs().HardwareAddr, macB, a, m.Gateway())
	for range 5 {
		if err := unix.Sendto(fd, frame, 0, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifindex}); err != nil {
			t.Fatal(err)
		}
	}
	fdb, err := netlink.NeighList(0, unix.AF_BRIDGE)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range fdb {
		if bytes.Equal(n.HardwareAddr, macB) {
			if l, err := netlink.LinkByIndex(n.LinkIndex); err == nil && l.Attrs().Name == hostVeth("macsp-a") {
				t.Errorf("the bridge learned B's MAC on A's port")
			}
		}
	}
	send(9, "for-b-only")
	unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Usec: 300000})
	buf := make([]byte, 4096)
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			continue
		}
		if bytes.Contains(buf[:n], []byte("for-b-only")) {
			t.Fatal("A got the host's packet for B by claiming B's MAC")
		}
	}
}
