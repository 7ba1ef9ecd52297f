package image

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/errdefs"
)

// A pull is the server connecting where a key tells it to: it must not be
// a way into the host or its networks. What a pull may connect to:
//
//   - A registry named by a pull must be one the admin configured
//     (Options.Mirrors, Insecure, Allowed) or, unless Options.Allowed is
//     set, any registry on public addresses.
//   - Every connection a pull makes (the registry, each redirect, each
//     token realm, whatever their names resolve to) is checked when it is
//     dialled, address by address: loopback, link-local, private (RFC 1918,
//     ULA), CGNAT, multicast, unspecified, documentation and reserved
//     addresses, their IPv4-mapped and NAT64 forms, and the sandbox subnet
//     (Options.Blocked) are refused unless the host dialled, as named, is
//     one the admin listed. The check runs on the resolved address that is
//     connected to, so a DNS answer that changes between a check and the
//     connect (rebinding) cannot pass.
//   - Plain HTTP only to hosts listed as insecure (Options.Insecure, an
//     http:// mirror).
//   - Dial, TLS handshake and response headers each have a bound, and a
//     whole pull has Options.PullTimeout.
//   - No error shows what a registry sent: a status and a short code at
//     most (classify); the full error is logged (Store.pullFailed).

// DefaultPullTimeout is Options.PullTimeout when it is not set.
const DefaultPullTimeout = 30 * time.Minute

const (
	dialTimeout   = 10 * time.Second
	tlsTimeout    = 10 * time.Second
	headerTimeout = 30 * time.Second

	codeNotAllowed = client.CodeRegistryNotAllowed // 403: a registry or address a pull may not reach
	codeTimeout    = client.CodeRegistryTimeout    // 504: a registry that did not answer in time
)

// special are the networks a pull connects to only on hosts the admin
// listed: everything but the public unicast internet.
var special = func() []netip.Prefix {
	var out []netip.Prefix
	for _, s := range []string{
		"0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12",
		"192.0.0.0/24", "192.0.2.0/24", "192.88.99.0/24", "192.168.0.0/16", "198.18.0.0/15",
		"198.51.100.0/24", "203.0.113.0/24", "224.0.0.0/4", "240.0.0.0/4",
		"::/96", "::ffff:0:0/96", "64:ff9b:1::/48", "100::/64", "2001::/23", "2001:db8::/32",
		"2002::/16", "fc00::/7", "fe80::/10", "fec0::/10", "ff00::/8",
	} {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}()

var nat64 = netip.MustParsePrefix("64:ff9b::/96")

// guard decides where a pull may connect, and makes the transports that
// hold to it.
type guard struct {
	listed  map[string]bool // host:port or host entries the admin listed (mirrors, insecure, allowed)
	allowed map[string]bool // Options.Allowed (and mirrors, insecure): the only registries, when set
	only    bool            // Options.Allowed was given: other registries are refused by name
	// hubViaMirror: Docker Hub names may be pulled through the mirrors
	// though docker.io itself is not allowed (only, and mirrors set).
	hubViaMirror bool
	insecure     map[string]bool // hosts reached over plain HTTP
	blocked      []netip.Prefix  // the sandbox subnet and other networks of this host
	resolve      func(ctx context.Context, host string) ([]netip.Addr, error)

	dialTimeout, tlsTimeout, headerTimeout time.Duration

	once         sync.Once
	strict, skip http.RoundTripper // transports, made once (connections are pooled)
}

func newGuard() *guard {
	return &guard{
		listed: map[string]bool{}, allowed: map[string]bool{}, insecure: map[string]bool{},
		resolve: func(ctx context.Context, host string) ([]netip.Addr, error) {
			return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		},
		dialTimeout: dialTimeout, tlsTimeout: tlsTimeout, headerTimeout: headerTimeout,
	}
}

// isListed reports whether the admin listed hostport ("host:port"), by
// itself or by its host alone.
func (g *guard) isListed(hostport string) bool {
	hostport = strings.ToLower(hostport)
	if g.listed[hostport] {
		return true
	}
	host, _, err := net.SplitHostPort(hostport)
	return err == nil && g.listed[host]
}

// refusal says why addr is not one a pull connects to ("" if it is).
func (g *guard) refusal(addr netip.Addr) string {
	a := addr.WithZone("")
	if nat64.Contains(a) {
		b := a.As16()
		a = netip.AddrFrom4([4]byte{b[12], b[13], b[14], b[15]})
	}
	a = a.Unmap()
	for _, p := range g.blocked {
		if p.Contains(a) {
			return "an address of this host's sandboxes"
		}
	}
	switch {
	case a.IsLoopback():
		return "a loopback address"
	case a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast():
		return "a link-local address"
	case a.IsPrivate():
		return "a private address"
	case a.IsUnspecified():
		return "an unspecified address"
	case a.IsMulticast():
		return "a multicast address"
	}
	for _, p := range special {
		if p.Contains(a) {
			return "a private or reserved address"
		}
	}
	return ""
}

// refusedError is a connection a pull may not make.
type refusedError struct {
	host  string // as dialled, host:port
	addr  string // the address refused, or "" for plain HTTP
	why   string
	realm string // the token realm a 401 named, when that is what was refused
}

func (e *refusedError) Error() string {
	switch {
	case e.realm != "":
		return fmt.Sprintf("token realm %q refused: %s", e.realm, e.why)
	case e.addr == "":
		return fmt.Sprintf("plain HTTP to %s refused", e.host)
	}
	return fmt.Sprintf("connect to %s (%s) refused: %s", e.host, e.addr, e.why)
}

// dial resolves addr itself and connects only to addresses the policy
// allows; the dialer's Control checks the address really connected to.
func (g *guard) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	listed := g.isListed(addr)
	var ips []netip.Addr
	if ip, perr := netip.ParseAddr(host); perr == nil {
		ips = []netip.Addr{ip}
	} else if ips, err = g.resolve(ctx, host); err != nil {
		return nil, err
	}
	if len(ips) == 0 {
		return nil, &net.DNSError{Err: "no addresses", Name: host, IsNotFound: true}
	}
	if !listed {
		// One bad answer refuses the host: a name that also points into
		// the host's networks is not a registry's.
		for _, ip := range ips {
			if why := g.refusal(ip); why != "" {
				return nil, &refusedError{host: addr, addr: ip.String(), why: why}
			}
		}
	}
	d := &net.Dialer{Timeout: g.dialTimeout, Control: func(_, address string, _ syscall.RawConn) error {
		ap, err := netip.ParseAddrPort(address)
		if err != nil {
			return err
		}
		if why := g.refusal(ap.Addr()); why != "" && !listed {
			return &refusedError{host: addr, addr: ap.Addr().String(), why: why}
		}
		return nil
	}}
	var firstErr error
	for _, ip := range ips {
		c, err := d.DialContext(ctx, network, net.JoinHostPort(ip.String(), port))
		if err == nil {
			return c, nil
		}
		if firstErr == nil {
			firstErr = err
		}
		if ctx.Err() != nil {
			break
		}
	}
	return nil, firstErr
}

// guardedTransport refuses plain HTTP to hosts not listed as insecure
// (go-containerregistry tries it on its own for loopback and RFC 1918
// registries), then sends the request through a guarded dialer.
type guardedTransport struct {
	g    *guard
	base http.RoundTripper
}

func (t guardedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Scheme != "https" && !t.g.insecure[strings.ToLower(req.URL.Host)] && !t.g.insecure[strings.ToLower(req.URL.Hostname())] {
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, &refusedError{host: req.URL.Host, why: "plain HTTP"}
	}
	resp, err := t.base.RoundTrip(req)
	if err != nil || resp.StatusCode != http.StatusUnauthorized {
		return resp, err
	}
	if re := t.g.realmRefused(resp.Header.Values("WWW-Authenticate")); re != nil {
		resp.Body.Close()
		return nil, re
	}
	return resp, nil
}

// realmRe finds the realm parameters of WWW-Authenticate challenges,
// quoted or not.
var realmRe = regexp.MustCompile(`(?i)(?:^|[\s,])realm\s*=\s*(?:"([^"]*)"|([^\s,]+))`)

// realmRefused refuses a 401 whose token realm is an IP literal a pull
// does not connect to. A realm named by a host name is checked when it is
// dialled; an IP literal is checked here, before go-containerregistry
// refuses a private one itself with an error of no type.
func (g *guard) realmRefused(challenges []string) *refusedError {
	for _, c := range challenges {
		for _, m := range realmRe.FindAllStringSubmatch(c, -1) {
			realm := m[1] + m[2]
			u, err := url.Parse(realm)
			if err != nil {
				continue // go-containerregistry refuses it (classify)
			}
			ip, err := netip.ParseAddr(u.Hostname())
			if err != nil {
				continue
			}
			hostport := u.Host
			if u.Port() == "" {
				port := "443"
				if u.Scheme == "http" {
					port = "80"
				}
				hostport = net.JoinHostPort(u.Hostname(), port)
			}
			if g.isListed(hostport) {
				continue
			}
			if why := g.refusal(ip); why != "" {
				return &refusedError{host: hostport, addr: ip.String(), why: why, realm: realm}
			}
		}
	}
	return nil
}

// transport is a transport whose every connection the guard checks;
// skipVerify skips TLS verification.
func (g *guard) transport(skipVerify bool) http.RoundTripper {
	g.once.Do(func() { g.strict, g.skip = g.newTransport(false), g.newTransport(true) })
	if skipVerify {
		return g.skip
	}
	return g.strict
}

// closeIdle closes the registries' idle connections (at shutdown: each
// holds goroutines).
func (g *guard) closeIdle() {
	for _, rt := range []http.RoundTripper{g.strict, g.skip} {
		if t, ok := rt.(guardedTransport); ok {
			if ht, ok := t.base.(*http.Transport); ok {
				ht.CloseIdleConnections()
			}
		}
	}
}

func (g *guard) newTransport(skipVerify bool) http.RoundTripper {
	t := remote.DefaultTransport.(*http.Transport).Clone()
	t.DialContext = g.dial
	t.DialTLSContext = nil
	t.TLSHandshakeTimeout = g.tlsTimeout
	t.ResponseHeaderTimeout = g.headerTimeout
	if skipVerify {
		t.TLSClientConfig = insecureTLS()
	}
	return guardedTransport{g: g, base: t}
}

// check refuses, before anything is connected, a pull from a registry
// the policy does not allow: one not configured when Options.Allowed is
// set, and one whose name is or resolves to an address of the host's
// networks, unless listed. The dialer checks again at every connect.
func (g *guard) check(ctx context.Context, r name.Reference, what string) error {
	reg := r.Context().RegistryStr()
	if reg == "localhost" {
		return errdefs.Invalid("cannot pull %q: localhost/ names images imported into a project (shard image import), not a registry; a registry on this host is named with its port (127.0.0.1:5000/...) and must be allowed with shard serve --allowed-registry", what)
	}
	if g.isListed(reg) || g.listed[strings.ToLower(reg)] {
		return nil
	}
	if g.only && !(reg == name.DefaultRegistry && g.hubViaMirror) {
		return notAllowed(what, reg, "it is not one of the registries this server pulls from")
	}
	host := reg
	if h, _, err := net.SplitHostPort(reg); err == nil {
		host = h
	}
	host = strings.Trim(host, "[]")
	var ips []netip.Addr
	if ip, err := netip.ParseAddr(host); err == nil {
		ips = []netip.Addr{ip}
	} else if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		ips = []netip.Addr{netip.MustParseAddr("127.0.0.1")}
	} else {
		// A name that does not resolve is left to the pull to report.
		ips, _ = g.resolve(ctx, host)
	}
	for _, ip := range ips {
		if why := g.refusal(ip); why != "" {
			return notAllowed(what, reg, "it is "+why)
		}
	}
	return nil
}

func notAllowed(what, reg, why string) error {
	return errdefs.New(errdefs.KindForbidden, codeNotAllowed,
		"cannot pull %q from registry %s: %s; an admin may allow it with shard serve --allowed-registry %s (or --insecure-registry %s for plain HTTP)",
		what, registryShown(reg), why, registryShown(reg), registryShown(reg))
}

func registryShown(reg string) string {
	if reg == name.DefaultRegistry {
		return dockerHub
	}
	return reg
}

// refusedFor classifies a connection the guard refused while pulling what
// from registry: the registry itself, or a host it sent the pull on to
// (a redirect, a token realm), which is not named (the registry chose it).
func refusedFor(err error, what, registry string) (error, bool) {
	var re *refusedError
	if !errors.As(err, &re) {
		return nil, false
	}
	host := re.host
	if h, _, e := net.SplitHostPort(host); e == nil {
		host = h
	}
	regHost := registry
	if h, _, e := net.SplitHostPort(registry); e == nil {
		regHost = h
	}
	var msg string
	switch {
	case re.addr == "" && strings.EqualFold(host, regHost):
		msg = fmt.Sprintf("cannot pull %q: registry %s is not listed as insecure, so it is not reached over plain HTTP (shard serve --insecure-registry %s)", what, registryShown(registry), registryShown(registry))
	case re.addr == "":
		msg = fmt.Sprintf("cannot pull %q: registry %s sent the pull on to a plain HTTP address, which this server does not follow", what, registryShown(registry))
	case re.realm == "" && strings.EqualFold(host, regHost):
		msg = fmt.Sprintf("cannot pull %q from registry %s: it resolves to %s; an admin may allow it with shard serve --allowed-registry %s", what, registryShown(registry), re.why, registryShown(registry))
	default:
		msg = fmt.Sprintf("cannot pull %q: registry %s sent the pull on to %s (a redirect or token service), which this server does not connect to", what, registryShown(registry), re.why)
	}
	return &errdefs.Error{Kind: errdefs.KindForbidden, Code: codeNotAllowed, Msg: msg, Err: err}, true
}

// ggcrRealmRefusals are the texts of go-containerregistry's own refusals
// of a token service (pkg/v1/remote/transport/bearer.go, v0.22:
// fromChallenge's "invalid realm in www-authenticate: %w" and
// realmRedirectCheck's "refusing token-server redirect to %q: %w", each
// of validateRealmURL's "realm host %q is a private or link-local
// address" or "realm scheme %q not allowed ..."). They have no type, so
// their text is matched; guardedTransport refuses the IP literals of the
// first before go-containerregistry sees them, and these are what is left:
// a realm the admin listed, plain HTTP for a secure registry, a token
// service's redirect.
var ggcrRealmRefusals = []string{"invalid realm in www-authenticate: ", "refusing token-server redirect to "}

// realmRefusedFor classifies go-containerregistry's refusal of a token
// service the registry named while pulling what.
func realmRefusedFor(err error, what, registry string) (error, bool) {
	text := err.Error()
	for _, r := range ggcrRealmRefusals {
		if strings.Contains(text, r) {
			return &errdefs.Error{Kind: errdefs.KindForbidden, Code: codeNotAllowed, Err: err,
				Msg: fmt.Sprintf("cannot pull %q: registry %s sent the pull on to a token service at a private or link-local address, or over plain HTTP, which this server does not connect to", what, registryShown(registry))}, true
		}
	}
	return nil, false
}
