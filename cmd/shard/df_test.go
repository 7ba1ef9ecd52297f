package main

import (
	"slices"
	"testing"

	"github.com/useshards/shard/client"
)

func TestDfRows(t *testing.T) {
	du := &client.DiskUsage{
		Images:       client.DiskUsageItem{Count: 2, Bytes: 128974848},
		Sandboxes:    client.DiskUsageItem{Count: 3, Bytes: 3 << 20},
		Snapshots:    client.DiskUsageItem{},
		Checkpoints:  client.DiskUsageItem{Count: 1, Bytes: 300 << 20},
		Environments: client.DiskUsageItem{Count: 1, Bytes: 1 << 30},
		Server:       client.DiskUsageItem{Count: 4, Bytes: 50 << 20},
		TotalBytes:   128974848 + 3<<20 + 300<<20 + 1<<30 + 50<<20,
	}
	want := [][3]string{
		{"images", "2", "123MiB"},
		{"sandboxes", "3", "3MiB"},
		{"snapshots", "0", "0B"},
		{"checkpoints", "1", "300MiB"},
		{"environments", "1", "1GiB"},
		{"server", "4", "50MiB"},
		{"total", "-", "1.5GiB"},
	}
	if got := dfRows(du); !slices.Equal(got, want) {
		t.Errorf("dfRows:\n got %q\nwant %q", got, want)
	}
}
