package network

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// The DNS proxy is how domain names in egress policies are enforced: the
// firewall sees addresses only, so the addresses a sandbox may reach for
// "example.org" are the ones the proxy answered it for example.org. Each
// answer is put in the sandbox's sets (allowed: r-, denied: x-) before the
// sandbox gets it, so its first connection already finds the rule.
//
// It is also a way out: a query for <data>.attacker.example reaches
// attacker.example's name servers through the upstream resolver. So a
// sandbox whose policy limits names (deny-all, an allow list, or a denied
// domain) has only the names its policy allows forwarded (judgeQuery);
// the rest are answered REFUSED by the proxy itself and go nowhere.
const (
	dnsUpstreamTimeout = 5 * time.Second  // for one query, all upstreams together
	dnsMaxInFlight     = 256              // queries being forwarded at once
	dnsMaxTCPConns     = 64               // open TCP connections from sandboxes
	dnsTCPIdle         = 10 * time.Second // a TCP connection with no query is closed

	// One sandbox's share, so that one flooding the proxy slows only
	// itself: queries a second (sustained, and in a burst), queries in
	// flight, open TCP connections. Over them, a UDP query is dropped (the
	// client retries) and a TCP connection closed.
	dnsRatePerSrc     = 100
	dnsBurstPerSrc    = 200
	dnsInFlightPerSrc = 32
	dnsTCPPerSrc      = 8
)

// EDE (RFC 8914) put in a refusal's OPT record when the query had one:
// 18, "Prohibited", says why to a client like dig.
const (
	ednsOptionEDE  = 15
	edeProhibited  = 18
	edeRefusalText = "denied by the sandbox's egress policy"
	// The answer named an address no sandbox of this server reaches.
	edeBoundaryText = "the answer points to an address sandboxes may not reach"
)

type dnsState struct {
	mu      sync.Mutex
	running bool
	stop    func()         // closes the listeners and the TCP connections; guarded by mu
	wg      sync.WaitGroup // the proxy's goroutines, waited for by stopDNS
}

type dnsProxy struct {
	m         *Manager
	upstreams []string // host:port
	inflight  chan struct{}
	tcpConns  chan struct{}
	lim       dnsLimiter

	connsMu sync.Mutex
	conns   map[net.Conn]struct{} // open TCP connections; nil once stopped
}

// StartDNS starts the DNS proxy on the gateway (port 53, UDP and TCP), the
// name server of Manager.ResolvConf. It forwards each query from a sandbox
// to upstreams ("IP" or "IP:port"; empty: the host's /etc/resolv.conf name
// servers, loopback ones included since the proxy runs on the host) and
// hands the answer back unchanged, after opening or closing the answered
// addresses for that sandbox as its policy's domain names say. A sandbox is
// known by its source address, which the bridge's anti-spoofing rules keep
// honest (see firewall). Under a policy that limits names, a query the
// policy does not allow is answered REFUSED and never forwarded (see
// judgeQuery). Queries from addresses that are not sandboxes are refused.
// Each sandbox has a share of the proxy (dnsRatePerSrc and the like). It
// returns once listening, and stops when ctx ends.
func (m *Manager) StartDNS(ctx context.Context, upstreams []string) error {
	ups, err := dnsUpstreams(upstreams)
	if err != nil {
		return err
	}
	m.dns.mu.Lock()
	defer m.dns.mu.Unlock()
	if m.dns.running {
		return errors.New("the DNS proxy is running already")
	}
	addr := netip.AddrPortFrom(m.gateway, 53).String()
	var lc net.ListenConfig
	pc, err := lc.ListenPacket(ctx, "udp4", addr)
	if err != nil {
		return fmt.Errorf("DNS proxy: %w", err)
	}
	ln, err := lc.Listen(ctx, "tcp4", addr)
	if err != nil {
		pc.Close()
		return fmt.Errorf("DNS proxy: %w", err)
	}
	m.dns.running = true
	d := newDNSProxy(m, ups)
	var once sync.Once
	m.dns.stop = func() {
		once.Do(func() {
			pc.Close()
			ln.Close()
			d.closeConns()
		})
	}
	d.spawn(func() { d.serveUDP(pc.(*net.UDPConn)) })
	d.spawn(func() { d.serveTCP(ln) })
	context.AfterFunc(ctx, m.stopDNS) // or Manager.Close, whichever comes first
	m.cfg.Log.Info("DNS proxy listening", "addr", addr, "upstreams", ups)
	return nil
}

// stopDNS stops the DNS proxy, if it runs, and waits for its goroutines
// (each a query bounded by dnsUpstreamTimeout, or a TCP connection, which
// it closes).
func (m *Manager) stopDNS() {
	m.dns.mu.Lock()
	stop := m.dns.stop
	m.dns.stop = nil
	m.dns.mu.Unlock()
	if stop == nil {
		return
	}
	stop()
	m.dns.wg.Wait()
	m.dns.mu.Lock()
	m.dns.running = false
	m.dns.mu.Unlock()
}

// spawn runs f as one of the proxy's goroutines.
func (d *dnsProxy) spawn(f func()) {
	d.m.dns.wg.Add(1)
	go func() {
		defer d.m.dns.wg.Done()
		f()
	}()
}

// track adds c to the TCP connections closed at stop; false if stopped.
func (d *dnsProxy) track(c net.Conn) bool {
	d.connsMu.Lock()
	defer d.connsMu.Unlock()
	if d.conns == nil {
		return false
	}
	d.conns[c] = struct{}{}
	return true
}

func (d *dnsProxy) untrack(c net.Conn) {
	d.connsMu.Lock()
	delete(d.conns, c)
	d.connsMu.Unlock()
}

func (d *dnsProxy) closeConns() {
	d.connsMu.Lock()
	all := d.conns
	d.conns = nil
	d.connsMu.Unlock()
	for c := range all {
		c.Close()
	}
}

func newDNSProxy(m *Manager, ups []string) *dnsProxy {
	return &dnsProxy{m: m, upstreams: ups, inflight: make(chan struct{}, dnsMaxInFlight),
		tcpConns: make(chan struct{}, dnsMaxTCPConns), conns: map[net.Conn]struct{}{}, lim: dnsLimiter{srcs: map[netip.Addr]*dnsSrc{}}}
}

func dnsUpstreams(in []string) ([]string, error) {
	if len(in) == 0 {
		b, err := os.ReadFile("/etc/resolv.conf")
		if err != nil {
			return nil, fmt.Errorf("DNS upstreams: %w", err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "nameserver" {
				in = append(in, f[1])
			}
		}
		if len(in) == 0 {
			return nil, errors.New("DNS upstreams: /etc/resolv.conf names no name server; give one")
		}
	}
	var out []string
	for _, s := range in {
		s = strings.TrimSpace(s)
		if ap, err := netip.ParseAddrPort(s); err == nil {
			out = append(out, ap.String())
			continue
		}
		a, err := netip.ParseAddr(strings.Trim(s, "[]"))
		if err != nil {
			return nil, fmt.Errorf("DNS upstream %q is not an IP or IP:port", s)
		}
		out = append(out, netip.AddrPortFrom(a.WithZone(""), 53).String())
	}
	return out, nil
}

func (d *dnsProxy) serveUDP(pc *net.UDPConn) {
	buf := make([]byte, 65535)
	for {
		n, from, err := pc.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		src := from.Addr().Unmap()
		if !d.m.fw.isSandboxAddr(src) {
			// Answered at once (REFUSED), with no goroutine, no share.
			if resp := d.handle(src, buf[:n], false); resp != nil {
				pc.WriteToUDPAddrPort(resp, from)
			}
			continue
		}
		if !d.lim.admit(src, time.Now()) {
			continue // over its share: the client retries
		}
		select {
		case d.inflight <- struct{}{}:
		default:
			d.lim.done(src)
			continue // too busy: the client retries
		}
		q := append([]byte(nil), buf[:n]...)
		d.spawn(func() {
			defer func() { <-d.inflight; d.lim.done(src) }()
			if resp := d.handle(src, q, false); resp != nil {
				pc.WriteToUDPAddrPort(resp, from)
			}
		})
	}
}

func (d *dnsProxy) serveTCP(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		from, _ := netip.ParseAddrPort(c.RemoteAddr().String())
		src := from.Addr().Unmap()
		sandbox := d.m.fw.isSandboxAddr(src)
		if sandbox && !d.lim.openTCP(src) {
			c.Close() // over its share of connections
			continue
		}
		select {
		case d.tcpConns <- struct{}{}:
		default:
			if sandbox {
				d.lim.closeTCP(src)
			}
			c.Close()
			continue
		}
		if !d.track(c) {
			<-d.tcpConns
			if sandbox {
				d.lim.closeTCP(src)
			}
			c.Close()
			return
		}
		d.spawn(func() {
			defer func() { <-d.tcpConns }()
			defer d.untrack(c)
			defer c.Close()
			if sandbox {
				defer d.lim.closeTCP(src)
			}
			for {
				c.SetDeadline(time.Now().Add(dnsTCPIdle))
				q, err := readTCPMsg(c)
				if err != nil {
					return
				}
				if sandbox && !d.lim.admit(src, time.Now()) {
					return // over its share: the client comes back later
				}
				d.inflight <- struct{}{}
				resp := d.handle(src, q, true)
				<-d.inflight
				if sandbox {
					d.lim.done(src)
				}
				if resp == nil {
					return
				}
				c.SetDeadline(time.Now().Add(dnsUpstreamTimeout))
				if err := writeTCPMsg(c, resp); err != nil {
					return
				}
			}
		})
	}
}

func readTCPMsg(r io.Reader) ([]byte, error) {
	var l [2]byte
	if _, err := io.ReadFull(r, l[:]); err != nil {
		return nil, err
	}
	b := make([]byte, binary.BigEndian.Uint16(l[:]))
	if _, err := io.ReadFull(r, b); err != nil {
		return nil, err
	}
	return b, nil
}

func writeTCPMsg(w io.Writer, m []byte) error {
	b := make([]byte, 2+len(m))
	binary.BigEndian.PutUint16(b, uint16(len(m)))
	copy(b[2:], m)
	_, err := w.Write(b)
	return err
}

// handle answers one query from src (nil: say nothing).
func (d *dnsProxy) handle(src netip.Addr, q []byte, tcp bool) []byte {
	if len(q) < 12 || q[2]&0x80 != 0 { // too short, or not a query
		return nil
	}
	if !d.m.fw.isSandboxAddr(src) {
		return dnsReply(q, dnsmessage.RCodeRefused)
	}
	fwd, rcode := judgeQuery(d.m.fw.policyOf(src), q)
	if fwd == nil {
		// Not a word of it goes upstream. The name is not logged: it may
		// be the very data that was meant to leave.
		d.m.cfg.Log.Debug("DNS proxy: query not forwarded", "sandbox", src, "rcode", rcode)
		return dnsRefusal(q, rcode)
	}
	resp, err := d.exchange(fwd, tcp)
	if err != nil {
		d.m.cfg.Log.Debug("DNS proxy: upstream", "err", err)
		return dnsReply(q, dnsmessage.RCodeServerFailure)
	}
	if a, why := d.m.boundaryAnswer(resp); why != "" {
		// A name that points into the boundary (DNS rebinding, or an
		// internal name): the sandbox could not reach the address, and
		// is not told it either.
		d.m.cfg.Log.Debug("DNS proxy: an answer points into the egress boundary", "sandbox", src, "addr", a, "why", why)
		return localReply(q, dnsmessage.RCodeRefused, true, edeBoundaryText)
	}
	if answers, ttls := parseAnswer(resp); len(answers) > 0 {
		if err := d.m.fw.learn(src, answers, ttls); err != nil {
			// Fail closed: a denied domain's address must not be handed
			// out before it is blocked.
			d.m.cfg.Log.Warn("DNS proxy: learn addresses", "sandbox", src, "err", err)
			return dnsReply(q, dnsmessage.RCodeServerFailure)
		}
	}
	return resp
}

// policyOf is the compiled policy installed for a sandbox address (nil:
// none). A compiled policy is never changed once installed (a change
// installs a new one), so it is safe to use after the lock is let go.
func (f *firewall) policyOf(src netip.Addr) *compiled {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.policies[src]
}

// judgeQuery decides what the proxy does with query q from a sandbox whose
// installed policy is cp (nil: none): forward fwd upstream, or (fwd nil)
// answer rcode itself.
//
// A policy that does not limit names (none, or one with only addresses and
// no default deny) has every query forwarded as it came. Under one that
// does, only a standard query (opcode QUERY) with exactly one question, of
// class IN, for a name the policy allows (Policy.AllowsName) is forwarded,
// and what is forwarded is rebuilt from what was judged: that question,
// the header's ID and its RD, AD and CD bits, and, if the query had an OPT
// record, one with its UDP size (clamped to 512-4096) and DO bit but no
// options. No other byte of the sandbox's reaches the upstream, so there is
// nothing an upstream could read differently from the proxy. Everything
// else is answered REFUSED (FORMERR if the query does not parse): several
// questions, none, another class (CHAOS, HESIOD, ANY), another opcode
// (NOTIFY, UPDATE), and every name the policy does not allow.
func judgeQuery(cp *compiled, q []byte) (fwd []byte, rcode dnsmessage.RCode) {
	if cp == nil || !cp.limitsNames() {
		return q, dnsmessage.RCodeSuccess
	}
	var p dnsmessage.Parser
	h, err := p.Start(q)
	if err != nil {
		return nil, dnsmessage.RCodeFormatError
	}
	if h.Response {
		return nil, dnsmessage.RCodeFormatError
	}
	if h.OpCode != 0 {
		return nil, dnsmessage.RCodeRefused
	}
	qs, err := p.AllQuestions()
	if err != nil {
		return nil, dnsmessage.RCodeFormatError
	}
	if len(qs) != 1 || qs[0].Class != dnsmessage.ClassINET {
		return nil, dnsmessage.RCodeRefused
	}
	if !cp.allowsName(normaliseName(qs[0].Name.String())) {
		return nil, dnsmessage.RCodeRefused
	}
	var opt *dnsmessage.ResourceHeader
	if p.SkipAllAnswers() == nil && p.SkipAllAuthorities() == nil {
		for {
			rh, err := p.AdditionalHeader()
			if err != nil {
				break
			}
			if rh.Type == dnsmessage.TypeOPT {
				opt = &rh
				break
			}
			if p.SkipAdditional() != nil {
				break
			}
		}
	}
	b := dnsmessage.NewBuilder(make([]byte, 0, 512), dnsmessage.Header{ID: h.ID,
		RecursionDesired: h.RecursionDesired, AuthenticData: h.AuthenticData, CheckingDisabled: h.CheckingDisabled})
	if b.StartQuestions() != nil || b.Question(qs[0]) != nil {
		return nil, dnsmessage.RCodeFormatError
	}
	if opt != nil {
		var o dnsmessage.ResourceHeader
		size := min(max(int(opt.Class), 512), 4096) // an OPT record's class is the UDP size
		if o.SetEDNS0(size, dnsmessage.RCodeSuccess, opt.DNSSECAllowed()) != nil ||
			b.StartAdditionals() != nil || b.OPTResource(o, dnsmessage.OPTResource{}) != nil {
			return nil, dnsmessage.RCodeFormatError
		}
	}
	out, err := b.Finish()
	if err != nil {
		return nil, dnsmessage.RCodeFormatError
	}
	return out, dnsmessage.RCodeSuccess
}

// exchange forwards q to the upstreams in turn, within dnsUpstreamTimeout
// in all, and returns the first answer to it.
func (d *dnsProxy) exchange(q []byte, tcp bool) ([]byte, error) {
	deadline := time.Now().Add(dnsUpstreamTimeout)
	var lastErr error
	for i, up := range d.upstreams {
		left := time.Until(deadline)
		if left <= 0 {
			break
		}
		try := time.Now().Add(left / time.Duration(len(d.upstreams)-i))
		resp, err := exchangeOne(up, q, tcp, try)
		if err == nil {
			return resp, nil
		}
		lastErr = err
	}
	if lastErr == nil {
		lastErr = errors.New("timed out")
	}
	return nil, lastErr
}

func exchangeOne(up string, q []byte, tcp bool, deadline time.Time) ([]byte, error) {
	network := "udp"
	if tcp {
		network = "tcp"
	}
	d := net.Dialer{Deadline: deadline}
	c, err := d.Dial(network, up)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	c.SetDeadline(deadline)
	if tcp {
		if err := writeTCPMsg(c, q); err != nil {
			return nil, err
		}
		resp, err := readTCPMsg(c)
		if err != nil {
			return nil, err
		}
		if !answers(q, resp) {
			return nil, fmt.Errorf("%s answered something else", up)
		}
		return resp, nil
	}
	if _, err := c.Write(q); err != nil {
		return nil, err
	}
	buf := make([]byte, 65535)
	for {
		n, err := c.Read(buf)
		if err != nil {
			return nil, err
		}
		if answers(q, buf[:n]) {
			return append([]byte(nil), buf[:n]...), nil
		}
	}
}

// answers reports whether resp is a response with q's ID.
func answers(q, resp []byte) bool {
	return len(resp) >= 12 && resp[0] == q[0] && resp[1] == q[1] && resp[2]&0x80 != 0
}

// dnsReply is an empty answer to q with rcode (nil if q does not parse).
func dnsReply(q []byte, rcode dnsmessage.RCode) []byte { return localReply(q, rcode, false, "") }

// dnsRefusal is the proxy's own answer to a query it does not forward: a
// REFUSED one says why in an EDE option (Prohibited) when the query had an
// OPT record.
func dnsRefusal(q []byte, rcode dnsmessage.RCode) []byte {
	return localReply(q, rcode, rcode == dnsmessage.RCodeRefused, edeRefusalText)
}

// localReply is the proxy's own answer to q with rcode; with ede, a
// query's OPT record is answered with an EDE option (Prohibited) of text.
func localReply(q []byte, rcode dnsmessage.RCode, ede bool, text string) []byte {
	var p dnsmessage.Parser
	h, err := p.Start(q)
	if err != nil {
		return nil
	}
	qs, qerr := p.AllQuestions()
	hasOPT := false
	if qerr == nil && ede && p.SkipAllAnswers() == nil && p.SkipAllAuthorities() == nil {
		for {
			rh, err := p.AdditionalHeader()
			if err != nil {
				break
			}
			if rh.Type == dnsmessage.TypeOPT {
				hasOPT = true
				break
			}
			if p.SkipAdditional() != nil {
				break
			}
		}
	}
	if len(qs) > 1 {
		qs = qs[:1] // a refusal need not echo a question list the sandbox made up
	}
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: h.ID, Response: true, OpCode: h.OpCode,
		RecursionDesired: h.RecursionDesired, RecursionAvailable: true, RCode: rcode})
	b.StartQuestions()
	for _, qq := range qs {
		b.Question(qq)
	}
	if hasOPT {
		var o dnsmessage.ResourceHeader
		if o.SetEDNS0(1232, dnsmessage.RCodeSuccess, false) == nil && b.StartAdditionals() == nil {
			data := binary.BigEndian.AppendUint16(nil, edeProhibited)
			data = append(data, text...)
			b.OPTResource(o, dnsmessage.OPTResource{Options: []dnsmessage.Option{{Code: ednsOptionEDE, Data: data}}})
		}
	}
	out, err := b.Finish()
	if err != nil {
		return nil
	}
	return out
}

// dnsLimiter keeps each sandbox address's share of the proxy: a token
// bucket of queries, the queries it has in flight, its TCP connections.
type dnsLimiter struct {
	mu    sync.Mutex
	srcs  map[netip.Addr]*dnsSrc
	swept time.Time
}

type dnsSrc struct {
	tokens   float64
	last     time.Time
	inflight int
	tcp      int
}

// admit takes one query of src's share; done gives its in-flight place
// back.
func (l *dnsLimiter) admit(src netip.Addr, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.get(src, now)
	s.tokens = min(s.tokens+now.Sub(s.last).Seconds()*dnsRatePerSrc, dnsBurstPerSrc)
	s.last = now
	if s.tokens < 1 || s.inflight >= dnsInFlightPerSrc {
		return false
	}
	s.tokens--
	s.inflight++
	return true
}

func (l *dnsLimiter) done(src netip.Addr) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if s := l.srcs[src]; s != nil && s.inflight > 0 {
		s.inflight--
	}
}

func (l *dnsLimiter) openTCP(src netip.Addr) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.get(src, time.Now())
	if s.tcp >= dnsTCPPerSrc {
		return false
	}
	s.tcp++
	return true
}

func (l *dnsLimiter) closeTCP(src netip.Addr) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if s := l.srcs[src]; s != nil && s.tcp > 0 {
		s.tcp--
	}
}

// get returns src's entry, made with a full bucket; once a minute the
// entries of sandboxes that are idle (full bucket, nothing open) go.
// Called with l.mu held.
func (l *dnsLimiter) get(src netip.Addr, now time.Time) *dnsSrc {
	if now.Sub(l.swept) > time.Minute {
		l.swept = now
		for a, s := range l.srcs {
			if s.inflight == 0 && s.tcp == 0 && s.tokens+now.Sub(s.last).Seconds()*dnsRatePerSrc >= dnsBurstPerSrc {
				delete(l.srcs, a)
			}
		}
	}
	s := l.srcs[src]
	if s == nil {
		s = &dnsSrc{tokens: dnsBurstPerSrc, last: now}
		l.srcs[src] = s
	}
	return s
}

// boundaryAnswer finds an address in resp, whatever its section (answer,
// authority, additional) or owner, that points where no sandbox may go:
// an A or AAAA record, or an SVCB or HTTPS record's address hints. An
// answer the proxy cannot read through to its end is refused as well (a
// sandbox's resolver may read more of it than the proxy did).
func (m *Manager) boundaryAnswer(resp []byte) (netip.Addr, string) {
	var p dnsmessage.Parser
	if _, err := p.Start(resp); err != nil {
		return netip.Addr{}, "an answer that does not parse"
	}
	if err := p.SkipAllQuestions(); err != nil {
		return netip.Addr{}, "an answer that does not parse"
	}
	sections := []struct {
		next func() (dnsmessage.ResourceHeader, error)
		skip func() error
	}{{p.AnswerHeader, p.SkipAnswer}, {p.AuthorityHeader, p.SkipAuthority}, {p.AdditionalHeader, p.SkipAdditional}}
	for _, sec := range sections {
		for {
			rh, err := sec.next()
			if errors.Is(err, dnsmessage.ErrSectionDone) {
				break
			}
			if err != nil {
				return netip.Addr{}, "an answer that does not parse"
			}
			var addrs []netip.Addr
			switch rh.Type {
			case dnsmessage.TypeA:
				r, err := p.AResource()
				if err != nil {
					return netip.Addr{}, "an answer that does not parse"
				}
				addrs = append(addrs, netip.AddrFrom4(r.A))
			case dnsmessage.TypeAAAA:
				r, err := p.AAAAResource()
				if err != nil {
					return netip.Addr{}, "an answer that does not parse"
				}
				addrs = append(addrs, netip.AddrFrom16(r.AAAA))
			case dnsmessage.TypeSVCB, dnsmessage.TypeHTTPS:
				var r dnsmessage.SVCBResource
				if rh.Type == dnsmessage.TypeSVCB {
					r, err = p.SVCBResource()
				} else {
					var h dnsmessage.HTTPSResource
					h, err = p.HTTPSResource()
					r = h.SVCBResource
				}
				if err != nil {
					return netip.Addr{}, "an answer that does not parse"
				}
				addrs = append(addrs, svcbHints(r)...)
			default:
				if err := sec.skip(); err != nil {
					return netip.Addr{}, "an answer that does not parse"
				}
			}
			for _, a := range addrs {
				if why := m.Refusal(a); why != "" {
					return a, why
				}
			}
		}
	}
	return netip.Addr{}, ""
}

// svcbHints are the ipv4hint and ipv6hint addresses of an SVCB or HTTPS
// record.
func svcbHints(r dnsmessage.SVCBResource) []netip.Addr {
	var out []netip.Addr
	if v, ok := r.GetParam(dnsmessage.SVCParamIPv4Hint); ok {
		for i := 0; i+4 <= len(v); i += 4 {
			out = append(out, netip.AddrFrom4([4]byte(v[i:i+4])))
		}
	}
	if v, ok := r.GetParam(dnsmessage.SVCParamIPv6Hint); ok {
		for i := 0; i+16 <= len(v); i += 16 {
			out = append(out, netip.AddrFrom16([16]byte(v[i:i+16])))
		}
	}
	return out
}

// parseAnswer reads the A records of a successful response that answer its
// question: owned by the question's name or by a name of the CNAME chain
// from it. Each address comes with the names it was reached by (question
// and chain, normalised) and the largest TTL it was given. Records about
// other names are ignored: a server does not get to vouch for names nobody
// asked about.
func parseAnswer(resp []byte) (map[netip.Addr][]string, map[netip.Addr]time.Duration) {
	var p dnsmessage.Parser
	h, err := p.Start(resp)
	if err != nil || !h.Response || h.RCode != dnsmessage.RCodeSuccess {
		return nil, nil
	}
	qs, err := p.AllQuestions()
	if err != nil || len(qs) == 0 {
		return nil, nil
	}
	as, cnames := readAnswers(&p)
	if len(as) == 0 {
		return nil, nil
	}
	chain := cnameChain(qs, cnames)
	names := make([]string, 0, len(chain))
	for n := range chain {
		names = append(names, n)
	}
	sort.Strings(names)
	addrs := map[netip.Addr][]string{}
	ttls := map[netip.Addr]time.Duration{}
	for _, a := range as {
		if !chain[a.owner] {
			continue
		}
		addrs[a.ip] = names
		if a.ttl > ttls[a.ip] {
			ttls[a.ip] = a.ttl
		}
	}
	if len(addrs) == 0 {
		return nil, nil
	}
	return addrs, ttls
}

// aRecord is an A record of an answer, by its owner's normalised name.
type aRecord struct {
	owner string
	ip    netip.Addr
	ttl   time.Duration
}

// readAnswers reads the answer section's A and CNAME records of class IN
// (by owner); a broken message gives what was read before the break.
func readAnswers(p *dnsmessage.Parser) (as []aRecord, cnames map[string][]string) {
	cnames = map[string][]string{}
	for {
		rh, err := p.AnswerHeader()
		if err != nil {
			return as, cnames // ErrSectionDone, or a broken message
		}
		owner := normaliseName(rh.Name.String())
		inet := rh.Class == dnsmessage.ClassINET
		switch {
		case rh.Type == dnsmessage.TypeA && inet:
			r, err := p.AResource()
			if err != nil {
				return as, cnames
			}
			as = append(as, aRecord{owner, netip.AddrFrom4(r.A), time.Duration(rh.TTL) * time.Second})
		case rh.Type == dnsmessage.TypeCNAME && inet:
			r, err := p.CNAMEResource()
			if err != nil {
				return as, cnames
			}
			cnames[owner] = append(cnames[owner], normaliseName(r.CNAME.String()))
		default:
			if err := p.SkipAnswer(); err != nil {
				return as, cnames
			}
		}
	}
}

// cnameChain is the questions' names (class IN) and every name the CNAME
// records lead to from them.
func cnameChain(qs []dnsmessage.Question, cnames map[string][]string) map[string]bool {
	chain := map[string]bool{}
	var todo []string
	for _, q := range qs {
		if q.Class == dnsmessage.ClassINET {
			n := normaliseName(q.Name.String())
			if !chain[n] {
				chain[n] = true
				todo = append(todo, n)
			}
		}
	}
	for len(todo) > 0 {
		n := todo[0]
		todo = todo[1:]
		for _, t := range cnames[n] {
			if !chain[t] {
				chain[t] = true
				todo = append(todo, t)
			}
		}
	}
	return chain
}
