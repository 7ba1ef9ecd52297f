package integration

import (
	"testing"

	"github.com/useshards/shard/client"
)

// A running sandbox's root is mounted under the data directory's run/: shard
// df once counted it again under "server", ~190 MiB per running sandbox.
func TestDiskUsageServerLeavesRunningRootsOut(t *testing.T) {
	e := need(t)
	for _, prov := range providers {
		t.Run(prov, func(t *testing.T) {
			sb := create(t, client.CreateRequest{Image: python, Name: "df-server-" + prov, Provider: prov})
			server := func() int64 {
				t.Helper()
				du, err := e.c.DiskUsage(ctxT(t))
				if err != nil {
					t.Fatal(err)
				}
				return du.Server.Bytes
			}
			running := server()
			if _, err := e.c.Stop(ctxT(t), sb.ID); err != nil {
				t.Fatal(err)
			}
			stopped := server()
			// The database and the runtime's logs change a little between
			// the two; the python image's root is over 100 MiB.
			if d := running - stopped; d > 8<<20 || d < -(8<<20) {
				t.Fatalf("server bytes %d with %s running, %d stopped: want its root left out", running, sb.Name, stopped)
			}
		})
	}
}
