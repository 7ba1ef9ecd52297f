package cluster

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Node-to-node requests carry a signature made with a key derived from the
// cluster key, over the sending node, the time, the method, the request
// URI and the principal the sender vouches for (whose API key it checked:
// that key is never sent on). A signature is good for SignWindow, so a
// request copied off the wire cannot be replayed later or changed.

// SignWindow is how far a signed request's time may be from the receiver's.
const SignWindow = 30 * time.Second

// Sign returns the proof that this node sends method uri for principal.
func (c *Cluster) Sign(method, uri string, principal []byte) string {
	return sign(c.signKey, c.cfg.Node, time.Now(), method, uri, principal)
}

// Verify checks a signature made by Sign on any node of this cluster and
// returns the node that made it.
func (c *Cluster) Verify(proof, method, uri string, principal []byte) (string, error) {
	return verify(c.signKey, time.Now(), proof, method, uri, principal)
}

func sign(key []byte, node string, now time.Time, method, uri string, principal []byte) string {
	t := strconv.FormatInt(now.Unix(), 10)
	return "node=" + node + ",t=" + t + ",sig=" + mac(key, node, t, method, uri, principal)
}

func mac(key []byte, node, t, method, uri string, principal []byte) string {
	m := hmac.New(sha256.New, key)
	for _, part := range []string{node, t, method, uri} {
		fmt.Fprintf(m, "%d:%s\n", len(part), part)
	}
	m.Write(principal)
	return hex.EncodeToString(m.Sum(nil))
}

func verify(key []byte, now time.Time, proof, method, uri string, principal []byte) (string, error) {
	var node, t, sig string
	for _, kv := range strings.Split(proof, ",") {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "node":
			node = v
		case "t":
			t = v
		case "sig":
			sig = v
		}
	}
	sec, err := strconv.ParseInt(t, 10, 64)
	if node == "" || err != nil || sig == "" {
		return "", fmt.Errorf("malformed node signature")
	}
	if d := now.Sub(time.Unix(sec, 0)); d > SignWindow || d < -SignWindow {
		return "", fmt.Errorf("node %s's signature is %s old: are the nodes' clocks in step?", node, d.Round(time.Second))
	}
	if !hmac.Equal([]byte(sig), []byte(mac(key, node, t, method, uri, principal))) {
		return "", fmt.Errorf("bad node signature (a node with another cluster key?)")
	}
	return node, nil
}
