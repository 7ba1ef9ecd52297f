package cluster

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Node-to-node requests carry a signature made with a key derived from the
// cluster key, over the sending node, the node it is for, the time, a
// random nonce, the
// method, the request URI and the principal the sender vouches for (whose
// API key it checked: that key is never sent on). A signature is good for
// SignWindow and once: a request copied off the wire cannot be changed,
// replayed later, replayed at once to the same node, or sent to another.

// SignWindow is how far a signed request's time may be from the receiver's.
const SignWindow = 30 * time.Second

// Sign returns the proof that this node sends method uri for principal
// to node to (which alone accepts it).
func (c *Cluster) Sign(to, method, uri string, principal []byte) string {
	return sign(c.signKey, c.cfg.Node, to, time.Now(), method, uri, principal)
}

// Verify checks a signature made by Sign on any node of this cluster, and
// not seen before, and returns the node that made it.
func (c *Cluster) Verify(proof, method, uri string, principal []byte) (string, error) {
	now := time.Now()
	node, err := verify(c.signKey, c.cfg.Node, now, proof, method, uri, principal)
	if err != nil {
		return "", err
	}
	if !c.seen.first(proof, now) {
		return "", fmt.Errorf("node %s's signature was used before (a replayed request)", node)
	}
	return node, nil
}

// seenProofs remembers the signatures of the last 2 SignWindows.
type seenProofs struct {
	mu   sync.Mutex
	at   map[string]time.Time // guarded by mu
	next time.Time            // when to forget the old ones; guarded by mu
}

// first reports whether proof is new, and remembers it.
func (s *seenProofs) first(proof string, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.at == nil {
		s.at = map[string]time.Time{}
	}
	if now.After(s.next) {
		for p, t := range s.at {
			if now.Sub(t) > 2*SignWindow {
				delete(s.at, p)
			}
		}
		s.next = now.Add(SignWindow)
	}
	if _, ok := s.at[proof]; ok {
		return false
	}
	s.at[proof] = now
	return true
}

func sign(key []byte, node, to string, now time.Time, method, uri string, principal []byte) string {
	t := strconv.FormatInt(now.Unix(), 10)
	b := make([]byte, 12)
	rand.Read(b)
	n := hex.EncodeToString(b)
	return "node=" + node + ",t=" + t + ",n=" + n + ",sig=" + mac(key, node, to, t, n, method, uri, principal)
}

func mac(key []byte, node, to, t, nonce, method, uri string, principal []byte) string {
	m := hmac.New(sha256.New, key)
	for _, part := range []string{node, to, t, nonce, method, uri} {
		fmt.Fprintf(m, "%d:%s\n", len(part), part)
	}
	m.Write(principal)
	return hex.EncodeToString(m.Sum(nil))
}

// verify checks proof on node self: made for self, by a node with the key.
func verify(key []byte, self string, now time.Time, proof, method, uri string, principal []byte) (string, error) {
	var node, t, nonce, sig string
	for _, kv := range strings.Split(proof, ",") {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "node":
			node = v
		case "t":
			t = v
		case "n":
			nonce = v
		case "sig":
			sig = v
		}
	}
	sec, err := strconv.ParseInt(t, 10, 64)
	if node == "" || err != nil || sig == "" || len(nonce) != 24 {
		return "", fmt.Errorf("malformed node signature")
	}
	if d := now.Sub(time.Unix(sec, 0)); d > SignWindow || d < -SignWindow {
		return "", fmt.Errorf("node %s's signature is %s old: are the nodes' clocks in step?", node, d.Round(time.Second))
	}
	if !hmac.Equal([]byte(sig), []byte(mac(key, node, self, t, nonce, method, uri, principal))) {
		return "", fmt.Errorf("bad node signature (a call made for another node, or by a node with another cluster key?)")
	}
	return node, nil
}
