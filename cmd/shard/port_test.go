package main

import (
	"net"
	"testing"
)

func TestParsePort(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int
		ok   bool
	}{
		{"8080", 8080, true},
		{"1", 1, true},
		{"65535", 65535, true},
		{"0", 0, false},
		{"65536", 0, false},
		{"-1", 0, false},
		{"http", 0, false},
		{"", 0, false},
	} {
		got, err := parsePort(tc.in)
		if got != tc.want || (err == nil) != tc.ok {
			t.Errorf("parsePort(%q) = %d, %v; want %d, ok %v", tc.in, got, err, tc.want, tc.ok)
		}
	}
}

func TestLocalURL(t *testing.T) {
	for _, tc := range []struct {
		addr net.Addr
		want string
	}{
		{&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 43121}, "http://127.0.0.1:43121/"},
		{&net.TCPAddr{IP: net.IPv4(10, 0, 0, 5), Port: 80}, "http://10.0.0.5:80/"},
		{&net.TCPAddr{IP: net.IPv4zero, Port: 8080}, "http://127.0.0.1:8080/"},
		{&net.TCPAddr{IP: net.IPv6unspecified, Port: 8080}, "http://[::1]:8080/"},
		{&net.TCPAddr{IP: net.ParseIP("fe80::1"), Port: 9}, "http://[fe80::1]:9/"},
	} {
		if got := localURL(tc.addr); got != tc.want {
			t.Errorf("localURL(%v) = %s, want %s", tc.addr, got, tc.want)
		}
	}
}
