package network

import (
	"fmt"
	"net/netip"
	"strings"
)

// Policy is a sandbox's egress policy. Entries are an IPv4 address, an IPv4
// CIDR, or a domain name ("example.org" matches it and every subdomain;
// "*.example.org" only subdomains).
//
// It is enforced outside the sandbox, in the host's firewall, keyed on the
// sandbox's address: nothing the sandbox does to itself (its own routes,
// resolver or firewall) can widen it. Domain names are enforced through the
// DNS proxy on the gateway (see StartDNS): the addresses it answers for a
// domain are what the domain means, for as long as the answer's TTL.
//
// Deny wins over allow. With DenyAll, or with any Allow entry, whatever is
// not allowed is denied; with only Deny entries, whatever is not denied is
// allowed.
type Policy struct {
	DenyAll bool     `json:"deny_all,omitempty"`
	Allow   []string `json:"allow,omitempty"`
	Deny    []string `json:"deny,omitempty"`
}

// maxPolicyEntries bounds the work one policy costs the firewall (its sets
// are rebuilt in one batch on every change).
const maxPolicyEntries = 4096

// Validate checks every entry and normalises it in place (lower case, no
// leading or trailing dots, CIDRs masked, duplicates dropped), so what is
// stored and shown back is what is enforced. The error names the first bad
// entry, e.g. `allow: "exa mple" is not an IP, a CIDR or a domain name`.
func (p *Policy) Validate() error {
	if p == nil {
		return nil
	}
	if n := len(p.Allow) + len(p.Deny); n > maxPolicyEntries {
		return fmt.Errorf("%d entries: at most %d are allowed", n, maxPolicyEntries)
	}
	var err error
	if p.Allow, err = normaliseEntries("allow", p.Allow); err != nil {
		return err
	}
	if p.Deny, err = normaliseEntries("deny", p.Deny); err != nil {
		return err
	}
	return nil
}

func normaliseEntries(field string, in []string) ([]string, error) {
	if len(in) == 0 {
		return nil, nil
	}
	out := make([]string, 0, len(in))
	seen := map[string]bool{}
	for _, raw := range in {
		e, err := parseEntry(raw)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", field, err)
		}
		s := e.String()
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out, nil
}

// Empty reports a policy that changes nothing (no deny-all, no entries):
// installing it is the same as removing the sandbox's policy.
func (p *Policy) Empty() bool {
	return p == nil || (!p.DenyAll && len(p.Allow) == 0 && len(p.Deny) == 0)
}

// Decide says what the policy allows for a destination ip, reached by the
// domain names it was resolved from (may be empty): deny wins over allow,
// and what neither list names is denied when DenyAll is set or Allow is not
// empty, allowed otherwise. The firewall rules are built to give the same
// answers (a nil or empty policy allows everything). Entries that do not
// parse are ignored: Validate first.
func (p *Policy) Decide(ip netip.Addr, names []string) bool {
	if p.Empty() {
		return true
	}
	c := compilePolicy(p)
	ip = ip.Unmap()
	norm := make([]string, len(names))
	for i, n := range names {
		norm[i] = normaliseName(n)
	}
	if c.deny.matches(ip, norm) {
		return false
	}
	if c.allow.matches(ip, norm) {
		return true
	}
	return !c.defaultDeny
}

// AllowsName says whether the policy lets a sandbox resolve name through
// the DNS proxy, with the same domain semantics as Decide: a denied name
// never is; an allowed one is; any other only when the policy does not
// deny by default (no DenyAll, no Allow entry). A nil or empty policy
// allows every name. Addresses and CIDRs play no part: a policy that
// allows only 10.0.0.0/8 resolves nothing. The DNS proxy forwards only
// what this allows (see StartDNS).
func (p *Policy) AllowsName(name string) bool {
	if p.Empty() {
		return true
	}
	return compilePolicy(p).allowsName(normaliseName(name))
}

// entry is one parsed policy entry: a prefix (an address is a /32) or a
// domain pattern.
type entry struct {
	prefix netip.Prefix
	domain string // "example.org" or "*.example.org"
}

func (e entry) String() string {
	if e.domain != "" {
		return e.domain
	}
	if e.prefix.Bits() == 32 {
		return e.prefix.Addr().String()
	}
	return e.prefix.String()
}

func parseEntry(raw string) (entry, error) {
	s := strings.ToLower(strings.TrimSpace(raw))
	bad := fmt.Errorf("%q is not an IP, a CIDR or a domain name", raw)
	if s == "" {
		return entry{}, fmt.Errorf("an entry is empty: each must be an IP, a CIDR or a domain name")
	}
	if strings.Contains(s, "/") {
		pfx, err := netip.ParsePrefix(s)
		if err != nil {
			return entry{}, bad
		}
		if !pfx.Addr().Is4() {
			return entry{}, fmt.Errorf("%q is IPv6: sandboxes have IPv4 only", raw)
		}
		return entry{prefix: pfx.Masked()}, nil
	}
	if a, err := netip.ParseAddr(s); err == nil {
		if !a.Is4() {
			if a.Is4In6() {
				return entry{prefix: netip.PrefixFrom(a.Unmap(), 32)}, nil
			}
			return entry{}, fmt.Errorf("%q is IPv6: sandboxes have IPv4 only", raw)
		}
		return entry{prefix: netip.PrefixFrom(a, 32)}, nil
	}
	if s == "*" || s == "*." {
		return entry{}, fmt.Errorf("%q is not an IP, a CIDR or a domain name (to deny everything not allowed, use deny_all)", raw)
	}
	wild := strings.HasPrefix(s, "*.")
	if wild {
		s = s[2:]
	}
	s = strings.Trim(s, ".")
	if !validDomain(s) {
		return entry{}, bad
	}
	if wild {
		s = "*." + s
	}
	return entry{domain: s}, nil
}

// validDomain accepts LDH labels (and '_', seen in real names), 1-63
// characters each, 253 in all, and refuses what only looks like a broken
// address (every label numeric, e.g. 10.0.0.256).
func validDomain(s string) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	numeric := true
	for _, l := range strings.Split(s, ".") {
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return false
		}
		for i := 0; i < len(l); i++ {
			c := l[i]
			switch {
			case c >= '0' && c <= '9':
			case c >= 'a' && c <= 'z', c == '-', c == '_':
				numeric = false
			default:
				return false
			}
		}
	}
	return !numeric
}

// normaliseName makes a DNS name comparable with policy domains.
func normaliseName(n string) string { return strings.Trim(strings.ToLower(n), ".") }

// domainMatch reports whether name (normalised) is covered by pattern:
// "example.org" covers itself and its subdomains, "*.example.org" only
// its subdomains.
func domainMatch(pattern, name string) bool {
	if strings.HasPrefix(pattern, "*.") {
		suffix := pattern[1:] // ".example.org"
		return len(name) > len(suffix) && strings.HasSuffix(name, suffix)
	}
	return name == pattern || (len(name) > len(pattern) && strings.HasSuffix(name, pattern) && name[len(name)-len(pattern)-1] == '.')
}

// side is one list of a compiled policy.
type side struct {
	prefixes []netip.Prefix
	domains  []string
}

func (s side) matchesName(names []string) bool {
	for _, d := range s.domains {
		for _, n := range names {
			if domainMatch(d, n) {
				return true
			}
		}
	}
	return false
}

func (s side) matches(ip netip.Addr, names []string) bool {
	for _, p := range s.prefixes {
		if p.Contains(ip) {
			return true
		}
	}
	return s.matchesName(names)
}

type compiled struct {
	allow, deny side
	defaultDeny bool
}

func (c *compiled) hasDomains() bool { return len(c.allow.domains)+len(c.deny.domains) > 0 }

// allowsName is Policy.AllowsName for a normalised name.
func (c *compiled) allowsName(name string) bool {
	one := []string{name}
	if c.deny.matchesName(one) {
		return false
	}
	if c.allow.matchesName(one) {
		return true
	}
	return !c.defaultDeny
}

// limitsNames reports whether some name is not allowed: the policy denies
// by default or denies a domain. A policy that does not limit names has its
// sandbox's queries forwarded as they are.
func (c *compiled) limitsNames() bool { return c.defaultDeny || len(c.deny.domains) > 0 }

func compilePolicy(p *Policy) *compiled {
	c := &compiled{defaultDeny: p.DenyAll || len(p.Allow) > 0}
	add := func(s *side, list []string) {
		for _, raw := range list {
			e, err := parseEntry(raw)
			if err != nil {
				continue
			}
			if e.domain != "" {
				s.domains = append(s.domains, e.domain)
			} else {
				s.prefixes = append(s.prefixes, e.prefix)
			}
		}
	}
	add(&c.allow, p.Allow)
	add(&c.deny, p.Deny)
	return c
}
