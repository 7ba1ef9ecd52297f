package network

import (
	"net/netip"
	"sync"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/errdefs"
)

// Pool hands out sandboxes' addresses in the bridge's subnet. An address is
// held by a record (the metadata store's, which inUse asks) or, for
// something that has none yet (a warm spare), by a reservation here.
type Pool struct {
	subnet  netip.Prefix
	gateway netip.Addr
	inUse   func(ip string) bool // an address a record holds
	admit   func() error         // may one more address be handed out (a limit); nil: yes

	mu       sync.Mutex
	last     netip.Addr      // the address handed out last; guarded by mu
	reserved map[string]bool // guarded by mu
}

// NewPool returns the pool of subnet's addresses past gateway. inUse says
// whether a record holds an address; admit, when set, is asked (with the
// pool held) before each address is handed out.
func NewPool(subnet netip.Prefix, gateway netip.Addr, inUse func(ip string) bool, admit func() error) *Pool {
	return &Pool{subnet: subnet, gateway: gateway, inUse: inUse, admit: admit, reserved: map[string]bool{}}
}

// Take picks a free address and calls claim with it while the pool is held,
// so that claim writes the record that holds it before another Take looks.
// If claim fails, the address stays free.
func (p *Pool) Take(claim func(ip netip.Addr) error) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	ip, err := p.next()
	if err != nil {
		return err
	}
	return claim(ip)
}

// Reserve takes a free address for something with no record yet, until
// Release, or Claim hands it to a record.
func (p *Pool) Reserve() (netip.Addr, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ip, err := p.next()
	if err == nil {
		p.reserved[ip.String()] = true
	}
	return ip, err
}

// Release frees a reserved address.
func (p *Pool) Release(ip string) {
	p.mu.Lock()
	delete(p.reserved, ip)
	p.mu.Unlock()
}

// Claim calls claim (which writes the record that now holds the reserved ip)
// while the pool is held, after admit; when it succeeds the reservation
// ends. On failure ip stays reserved.
func (p *Pool) Claim(ip string, claim func() error) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.admit != nil {
		if err := p.admit(); err != nil {
			return err
		}
	}
	if err := claim(); err != nil {
		return err
	}
	delete(p.reserved, ip)
	return nil
}

// next is the next free address after admit. Caller holds mu.
func (p *Pool) next() (netip.Addr, error) {
	if p.admit != nil {
		if err := p.admit(); err != nil {
			return netip.Addr{}, err
		}
	}
	used := func(ip string) bool { return p.reserved[ip] || p.inUse(ip) }
	ip, err := nextFree(p.subnet, p.gateway, p.last, used)
	if err != nil {
		return netip.Addr{}, err
	}
	p.last = ip
	return ip, nil
}

// nextFree is the first address after last (round robin in subnet, past
// the gateway, never the broadcast address) that used does not claim.
// Round robin from the last address handed out: an address just freed is
// the last to be reused, so stale neighbour entries and connections to a
// removed sandbox never reach a new one.
func nextFree(subnet netip.Prefix, gateway, last netip.Addr, used func(string) bool) (netip.Addr, error) {
	first := gateway.Next()
	ip := last.Next()
	if !last.IsValid() || !subnet.Contains(ip) {
		ip = first
	}
	for tries := 0; ; tries++ {
		if !subnet.Contains(ip.Next()) { // the broadcast address
			ip = first
			continue
		}
		if !used(ip.String()) {
			return ip, nil
		}
		if tries > 1<<20 {
			return netip.Addr{}, errdefs.Unavailable(client.CodeNoAddresses, "no free address left in %s", subnet)
		}
		ip = ip.Next()
	}
}
