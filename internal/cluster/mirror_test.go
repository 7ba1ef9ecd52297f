package cluster

import "testing"

// A load that began before this node's own write or removal does not undo
// it (a key made here is valid at once; a key revoked here stays revoked).
func TestMirrorKeepsLaterWrites(t *testing.T) {
	m := newMirror("/p/")
	m.put("tokens/new", []byte("n"), 12)
	m.del("tokens/revoked", 11)
	m.put("tokens/old", []byte("o1"), 3)
	m.replace(map[string]entry{
		"tokens/revoked": {value: []byte("r"), rev: 4},
		"tokens/old":     {value: []byte("o2"), rev: 9},
	}, 10)
	if v, ok := m.get("tokens/new"); !ok || string(v) != "n" {
		t.Errorf("a key written after the load: %q %v", v, ok)
	}
	if _, ok := m.get("tokens/revoked"); ok {
		t.Error("a key removed after the load came back")
	}
	if v, _ := m.get("tokens/old"); string(v) != "o2" {
		t.Errorf("the load's newer value: %q", v)
	}
	if got := len(m.list("tokens/")); got != 2 {
		t.Errorf("list: %d values, want 2", got)
	}
	m.put("tokens/old", []byte("stale"), 5) // an older write never wins
	if v, _ := m.get("tokens/old"); string(v) != "o2" {
		t.Errorf("after an older write: %q", v)
	}
	m.put("secrets/p/x", []byte("s"), 20) // never mirrored
	if _, ok := m.get("secrets/p/x"); ok {
		t.Error("a secret was mirrored")
	}
}
