package network

import (
	"net/netip"
	"time"

	"github.com/vishvananda/netlink"
)

// hostAddrs lists the IPv4 addresses of every interface of the host (the
// server's network namespace).
func hostAddrs() ([]netip.Addr, error) {
	list, err := netlink.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		return nil, err
	}
	out := make([]netip.Addr, 0, len(list))
	for _, a := range list {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			out = append(out, ip.Unmap())
		}
	}
	return out, nil
}

// HostAddrs are the host's IPv4 addresses as the boundary last saw them.
func (m *Manager) HostAddrs() []netip.Addr {
	m.bound.mu.Lock()
	defer m.bound.mu.Unlock()
	return append([]netip.Addr(nil), m.bound.host...)
}

// refreshHost puts the host's current addresses in the boundary.
func (m *Manager) refreshHost() error {
	as, err := hostAddrs()
	if err != nil {
		return err
	}
	changed, err := m.bound.setHost(as)
	if err != nil || !changed {
		return err
	}
	m.cfg.Log.Debug("egress boundary: this node's addresses", "addrs", ipv4(as))
	return m.fw.setBoundary(m.bound.sets())
}

// watchHost follows the host's addresses (one added by DHCP, a VPN or a
// new bridge is refused as soon as the kernel says it is there) until
// done is closed. A lost subscription (its channel closes) is made again,
// and the addresses listed anew.
func (m *Manager) watchHost(done <-chan struct{}) {
	defer close(m.watchDone)
	for {
		ch := make(chan netlink.AddrUpdate, 64)
		err := netlink.AddrSubscribeWithOptions(ch, done, netlink.AddrSubscribeOptions{ErrorCallback: func(err error) {
			select {
			case <-done: // the socket closed under it
			default:
				m.cfg.Log.Warn("egress boundary: address updates", "err", err)
			}
		}})
		if err != nil {
			m.cfg.Log.Warn("egress boundary: subscribe to address updates", "err", err)
			close(ch)
		}
		// What changed before the subscription.
		if err := m.refreshHost(); err != nil {
			m.cfg.Log.Warn("egress boundary: this node's addresses", "err", err)
		}
		for range ch {
			if err := m.refreshHost(); err != nil {
				m.cfg.Log.Warn("egress boundary: this node's addresses", "err", err)
			}
		}
		select {
		case <-done:
			return
		case <-time.After(time.Second):
		}
	}
}
