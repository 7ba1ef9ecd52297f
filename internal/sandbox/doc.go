// Package sandbox is shard's lifecycle: it creates, starts, stops, removes
// and execs into sandboxes, over a provider (the runtime), the image cache,
// the per-sandbox files (rootfs) and network, with the metadata store as the
// one record of what exists. It knows nothing of HTTP.
//
// The files, by job:
//
//   - service.go: the Service and its Config; deps.go: the small interfaces
//     it holds of images, storage and network (fake_test.go fakes them).
//   - create.go: a create request checked, its image, its shape, Create.
//   - records.go: records in state creating (an address each, from the
//     network.Pool), state moves (state.go: which are allowed).
//   - boot.go: the boot pipeline: stage (rootfs, netns, spec), launch (the
//     runtime, then the agent), halt, destroy. spec.go: the OCI spec of an
//     instance, with the runtime's provider.Guest hook for its bounds.
//   - lifecycle.go: Stop, Start, Remove, Get, List, under the sandbox's lock
//     (locks.go: the keyed locks and the checkpoints' uses).
//   - freeze.go: a running sandbox locked, paused, captured and thawed:
//     the checkpoint both Checkpoint and Fork make.
//   - fork.go: Fork, as phases of a forkOp. restore.go: a sandbox from a
//     checkpoint, staged then restored. checkpoint.go: checkpoints kept,
//     listed and dropped.
//   - spare.go: environments' warm spares; environment.go: environments.
//   - exec.go: Exec and its session; execreq.go: the exec's request, frames
//     and exit in the service's terms, and their translation to and from
//     the agent's (internal/agent/proto).
//   - resume.go, reconcile.go, grants.go, policy.go, snapshot.go,
//     memwatch.go (the gVisor agent's OOM guard, from host memory events),
//     watch.go (sandboxes that end on their own), usage.go, space.go.
//
// A fork request, file by file: fork.go Fork checks the request
// (forkNames) → freeze.go lockRunning takes the source's lock → fork.go
// newFork, then insertRecords (records.go) → freeze (fork.go) calls
// capture (freeze.go: pause, the runtime's checkpoint, the files' copy,
// thaw), and as soon as the source thaws stages each fork (restore.go
// stageRestore → boot.go stage) → restore (restore.go launchRestore →
// boot.go launch) → running (records.go move) → persist and tellSource.
// Every step that makes something registers its undo with one
// revert.Reverter, which runs them all if a later step fails.
package sandbox
