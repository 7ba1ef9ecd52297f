package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestClusterFlags(t *testing.T) {
	for _, tc := range []struct {
		o      clusterOptions
		listen string
		want   string // "" is no error
	}{
		{clusterOptions{}, "", ""},
		{clusterOptions{node: "a"}, "", "give --cluster-etcd too"},
		{clusterOptions{etcd: []string{"http://e:2379"}}, "", "give --listen too"},
		{clusterOptions{etcd: []string{"http://e:2379"}}, ":7070", "give --advertise"},
		{clusterOptions{etcd: []string{"http://e:2379"}, advertise: "https://h:7071"}, ":7070", "give --cluster-key"},
		{clusterOptions{etcd: []string{"http://e:2379"}, advertise: "https://h:7071", keyFile: "k", ttl: time.Second}, ":7070", "--node-ttl"},
		{clusterOptions{etcd: []string{"http://e:2379"}, advertise: "https://h:7071", keyFile: "k", ttl: 10 * time.Second, node: "a"}, ":7070", ""},
		{clusterOptions{etcd: []string{"http://e:2379"}, advertise: "http://h:7071"}, ":7070", "give an https:// URL"},
		{clusterOptions{etcd: []string{"http://e:2379"}, advertise: "https://h:7070"}, "h:7070", "a port of its own"},
		{clusterOptions{etcd: []string{"http://e:2379"}, advertise: "https://h:7071", listen: "h:7070"}, "h:7070", "a port of its own"},
	} {
		err := tc.o.check(tc.listen)
		if (err == nil) != (tc.want == "") || err != nil && !strings.Contains(err.Error(), tc.want) {
			t.Errorf("check(%+v): %v, want %q", tc.o, err, tc.want)
		}
	}
	for _, tc := range []struct {
		o    clusterOptions
		want string
	}{
		{clusterOptions{etcd: []string{"http://e:2379"}}, ""},
		{clusterOptions{etcd: []string{"http://e:2379"}, etcdCA: "ca.pem"}, "are for https://"},
		{clusterOptions{etcd: []string{"https://e:2379"}, etcdCert: "c.pem"}, "together"},
		{clusterOptions{etcd: []string{"https://e:2379"}, etcdCA: "/nonexistent"}, "--etcd-ca"},
	} {
		_, err := tc.o.etcdTLS()
		if (err == nil) != (tc.want == "") || err != nil && !strings.Contains(err.Error(), tc.want) {
			t.Errorf("etcdTLS(%+v): %v, want %q", tc.o, err, tc.want)
		}
	}
}

func TestClusterKeyFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, b []byte, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, mode); err != nil {
			t.Fatal(err)
		}
		os.Chmod(p, mode)
		return p
	}
	raw := []byte(strings.Repeat("k", 32))
	if k, err := readClusterKey(write("raw", raw, 0o600)); err != nil || string(k) != string(raw) {
		t.Fatalf("32 raw bytes: %v", err)
	}
	if k, err := readClusterKey(write("hex", []byte(strings.Repeat("ab", 32)+"\n"), 0o600)); err != nil || len(k) != 32 {
		t.Fatalf("64 hex digits: %v", err)
	}
	if _, err := readClusterKey(write("open", raw, 0o644)); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Fatalf("a key others may read: %v", err)
	}
	if _, err := readClusterKey(write("short", raw[:16], 0o600)); err == nil || !strings.Contains(err.Error(), "32 bytes") {
		t.Fatalf("a short key: %v", err)
	}
}
