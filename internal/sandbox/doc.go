// Package sandbox is shard's lifecycle: it creates, starts, stops, removes
// and execs into sandboxes, over a provider (the runtime), the image cache,
// the per-sandbox files (rootfs) and network, with the metadata store as the
// one record of what exists. It knows nothing of HTTP.
//
// The Service is the lifecycle and the steps every job shares; each other
// job is a type of its own that points back to it (link), which the API
// and the daemon reach through the Service's accessors. The files, by job:
//
//   - service.go: the Service, its Config and its jobs; deps.go: the small
//     interfaces it holds of images, storage and network (fake_test.go
//     fakes them).
//   - The lifecycle (Service): create.go: a create request checked, its
//     image, its shape, Create. records.go: records in state creating (an
//     address each, from the network.Pool), state moves (state.go: which
//     are allowed). boot.go: the boot pipeline: stage (rootfs, netns,
//     spec), launch (the runtime, then the agent), halt, destroy (discard:
//     of one that never ran, its ledger session too). spec.go:
//     the OCI spec of an instance, with the runtime's provider.Guest hook
//     for its bounds. lifecycle.go: Stop, Start, Remove, Get, List, under
//     the sandbox's lock (locks.go: the keyed locks and the checkpoints'
//     uses). freeze.go: a running sandbox locked, paused, captured and
//     thawed: the checkpoint both Checkpoint and Fork make. fork.go: Fork,
//     as phases of a forkOp; restore.go stages and launches its forks.
//     exec.go: Exec and its session; execreq.go: the exec's request, frames
//     and exit in the service's terms, and their translation to and from
//     the agent's (internal/agent/proto). contract.go: the fork contract's
//     announcement. images.go: an image held against its removal.
//     reconcile.go: Reconcile, its steps on a reconciler; watch.go
//     (sandboxes that end on their own), memwatch.go (the gVisor agent's
//     OOM guard, from host memory events), life.go (the service's own
//     goroutines, and Close), metrics.go.
//   - Admission (admission.go): host memory, projects' quotas and the
//     sandbox limit, checked before anything is made; usage.go: what is on
//     disk; space.go: room for a capture; ledgerfloor.go: the ledger's
//     floor of free space.
//   - Files (files.go): files in and out of a sandbox, through the files
//     helper; diff.go: what changed in its files; tree.go: the fork tree.
//   - Access (grants.go): secret grants; policy.go: egress policies;
//     conns.go: refused connections in the ledger.
//   - Saved (saved.go): checkpoint.go: checkpoints kept, listed and
//     dropped; restore.go: a sandbox from a checkpoint; retention.go: fork
//     checkpoints no sandbox needs removed, and space given back;
//     transfer.go: a checkpoint sent to another node; snapshot.go:
//     snapshots; environment.go: environments; spare.go: their warm spares.
//   - Sessions (resume.go): a ledger session resumed; ledgersweep.go:
//     sessions removed, by hand and past the ledger's retention.
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
