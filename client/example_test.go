package client_test

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/useshards/shard/client"
)

// The seed 001 walk-through in Go: set up a sandbox once, fork it twice,
// and try a different version of a package in each fork. (Not run by `go
// test`: it needs a server; test/integration runs the same flow.)
func Example() {
	ctx := context.Background()
	c, err := client.New(client.Options{}) // SHARD_REMOTE and SHARD_API_KEY, or the local socket
	if err != nil {
		log.Fatal(err)
	}
	base, err := c.Create(ctx, client.CreateRequest{Name: "base", Image: "python:3.12-slim", MemoryMiB: 512})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Remove(ctx, base.ID, true)
	pip := func(sb string, args ...string) {
		res, err := c.Exec(ctx, sb, client.ExecRequest{Argv: append([]string{"pip", "install", "--quiet"}, args...)})
		if err != nil || res.ExitCode != 0 {
			log.Fatalf("pip in %s: %v %s", sb, err, res.Stderr)
		}
	}
	pip(base.ID, "requests")
	tryA, err := c.Fork(ctx, base.ID, client.ForkRequest{Name: "try-a"})
	if err != nil {
		log.Fatal(err)
	}
	tryB, err := c.Fork(ctx, base.ID, client.ForkRequest{Name: "try-b"})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Remove(ctx, tryB.ID, true)
	pip(tryA.ID, "requests==2.31.0")
	pip(tryB.ID, "--upgrade", "requests")
	check := []string{"python", "-c", "import requests; print(requests.__version__)"}
	for _, sb := range []*client.Sandbox{tryA, tryB} {
		if _, err := c.ExecStream(ctx, sb.ID, client.ExecRequest{Argv: check}, os.Stdout, os.Stderr); err != nil {
			log.Fatal(err)
		}
	}
	if err := c.Remove(ctx, tryA.ID, true); err != nil {
		log.Fatal(err)
	}
}

// Checkpoint a running sandbox, then start a new one from it.
func ExampleClient_RestoreCheckpoint() {
	ctx := context.Background()
	c, _ := client.New(client.Options{})
	ck, err := c.Checkpoint(ctx, "base", client.CheckpointRequest{Tag: "after-install"})
	if err != nil {
		log.Fatal(err)
	}
	sb, err := c.RestoreCheckpoint(ctx, ck.ID, client.RestoreRequest{Name: "from-checkpoint"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(sb.ID)
}
