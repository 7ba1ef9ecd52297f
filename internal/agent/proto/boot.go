package proto

// What the host passes the agent at boot, in its environment, and the
// bounds it sets up from them.

// Environment variables the host sets on the agent process. They are removed
// from the environment commands inherit.
const (
	EnvToken       = "SHARD_AGENT_TOKEN"
	EnvMemoryLimit = "SHARD_AGENT_MEMORY_LIMIT" // bytes; enables the in-sandbox OOM guard (gVisor)
	// EnvOwnHome, "1": the sandbox's own environment (its image's or its
	// creator's) sets HOME. Without it, the agent's HOME is the runtime's
	// default for root, and a command run as a user gets that user's home
	// instead.
	EnvOwnHome = "SHARD_AGENT_OWN_HOME"
)

// Bounds the agent sets up inside a gVisor sandbox when it boots (see
// internal/agent/guest's bounds.go).
const (
	// EnvPids is the sandbox's process bound, enforced inside with
	// gVisor's own pids cgroup (gVisor only).
	EnvPids = "SHARD_AGENT_PIDS"
	// EnvTmpOnDisk, "1": /tmp is the rootfs's directory, on disk, as under
	// runc, instead of the tmpfs gVisor mounts there (gVisor only).
	EnvTmpOnDisk = "SHARD_AGENT_TMP_ON_DISK"
	// EnvPidsTasks, "3+5+6,4+5+6": open descriptors of the tasks files of
	// the host cgroups its commands start in, the bounded set and the
	// reserve's (runc: there the host's cgroups are the bounds, and the
	// agent must not share them with its commands: see the runc provider).
	EnvPidsTasks = "SHARD_AGENT_PIDS_TASKS"
)

// PidsReserve is how many processes commands may start past the bound when
// it is full, so `pkill` can still run to end a fork bomb. Each exec's
// first try is in the bounded cgroup; only when that fork fails with EAGAIN
// is it made again in the reserve (a cgroup of its own, bound to this).
const PidsReserve = 32

// AgentPids is the room for the agent's own threads beside the bound and
// the reserve, where the host's pids cgroup holds all three (runc).
const AgentPids = 64
