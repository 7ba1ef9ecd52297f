package cluster

import (
	"context"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strings"
)

// The cluster's addresses (etcd's and every node's) are kept out of the
// sandboxes' reach (internal/network's egress boundary): Config.OnAddrs is
// told of them when the node joins and after every heartbeat, so a node
// that joins is refused to sandboxes within a beat (TTL/3). While etcd
// cannot be read, the addresses known before are kept: only a list read
// from etcd shrinks the set.

// EndpointAddrs are the addresses of etcd URLs (host names looked up; what
// does not resolve is left out).
func EndpointAddrs(ctx context.Context, urls []string) []netip.Addr {
	as, _ := urlAddrs(ctx, urls)
	return as
}

// urlAddrs resolves the hosts of urls (bare host:port too); ok is false
// when one could not be.
func urlAddrs(ctx context.Context, urls []string) (out []netip.Addr, ok bool) {
	ok = true
	for _, raw := range urls {
		host := raw
		if u, err := url.Parse(raw); err == nil && u.Host != "" {
			host = u.Hostname()
		} else if h, _, err := net.SplitHostPort(raw); err == nil {
			host = h
		}
		host = strings.Trim(host, "[]")
		if host == "" {
			continue
		}
		if a, err := netip.ParseAddr(host); err == nil {
			out = append(out, a.Unmap())
			continue
		}
		as, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		if err != nil {
			ok = false
			continue
		}
		for _, a := range as {
			out = append(out, a.Unmap())
		}
	}
	return out, ok
}

// refreshAddrs reads the cluster's addresses and tells Config.OnAddrs: the
// etcd endpoints this node was given, etcd's members (client and peer
// URLs), every node's advertised address and the addresses each node
// publishes of itself (Stats.Addrs). An address etcd listens on but does
// not advertise is not known: docs/cluster.md has etcd listen where it
// advertises, and ask for client certificates.
func (c *Cluster) refreshAddrs(ctx context.Context) {
	if c.cfg.OnAddrs == nil {
		return
	}
	urls := slices.Clone(c.cfg.Endpoints)
	complete := true
	if ml, err := c.cli.MemberList(ctx); err == nil {
		for _, m := range ml.Members {
			urls = append(urls, m.ClientURLs...)
			urls = append(urls, m.PeerURLs...)
		}
	} else {
		complete = false
	}
	nodes, err := c.Nodes(ctx)
	complete = complete && err == nil
	var own []netip.Addr
	for _, n := range nodes {
		urls = append(urls, n.Address)
		for _, s := range n.Addrs {
			if a, err := netip.ParseAddr(s); err == nil {
				own = append(own, a.Unmap())
			}
		}
	}
	found, ok := urlAddrs(ctx, urls)
	found = append(found, own...)
	complete = complete && ok
	c.mu.Lock()
	if complete {
		c.addrs = found
	} else {
		c.addrs = append(c.addrs, found...)
	}
	slices.SortFunc(c.addrs, netip.Addr.Compare)
	c.addrs = slices.Compact(c.addrs)
	as := slices.Clone(c.addrs)
	c.mu.Unlock()
	c.cfg.OnAddrs(as)
}
