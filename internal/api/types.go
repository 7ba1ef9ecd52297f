package api

import "github.com/useshards/shard/client"

// The wire types live in the public client package, so the server and every
// Go user agree on them by construction.
type (
	Sandbox       = client.Sandbox
	Origin        = client.Origin
	CreateRequest = client.CreateRequest
	ExecRequest   = client.ExecRequest
	ExecEvent     = client.ExecEvent
	// The payloads of the binary exec stream's frames.
	ExecStarted  = client.ExecStarted
	ExecExit     = client.ExecExit
	ExecResize   = client.ExecResize
	ExecSignal   = client.ExecSignal
	Image        = client.Image
	PullRequest  = client.PullRequest
	PullEvent    = client.PullEvent
	Error        = client.Error
	ForkRequest  = client.ForkRequest
	ForkResponse = client.ForkResponse

	Checkpoint         = client.Checkpoint
	SandboxRemoved     = client.SandboxRemoved
	CheckpointRequest  = client.CheckpointRequest
	RestoreRequest     = client.RestoreRequest
	Snapshot           = client.Snapshot
	SnapshotRequest    = client.SnapshotRequest
	Session            = client.Session
	Event              = client.Event
	EventPage          = client.EventPage
	ResumeRequest      = client.ResumeRequest
	ResumeResponse     = client.ResumeResponse
	ReappliedChange    = client.ReappliedChange
	ReplayedExec       = client.ReplayedExec
	Environment        = client.Environment
	EnvironmentRequest = client.EnvironmentRequest
	DiskUsage          = client.DiskUsage
	DiskUsageItem      = client.DiskUsageItem
	StoreSpace         = client.StoreSpace
	HostSpace          = client.HostSpace
	Token              = client.Token
	Project            = client.Project
	ProjectQuota       = client.ProjectQuota
	ProjectUse         = client.ProjectUse
	TokenRequest       = client.TokenRequest
	TokenCreated       = client.TokenCreated
	Whoami             = client.Whoami
	Secret             = client.Secret
	SecretRequest      = client.SecretRequest
	Grant              = client.Grant
	Policy             = client.Policy
)
