package api

import "github.com/useshards/shard/client"

// The wire types live in the public client package, so the server and every
// Go user agree on them by construction.
type (
	Sandbox       = client.Sandbox
	CreateRequest = client.CreateRequest
	ExecRequest   = client.ExecRequest
	ExecEvent     = client.ExecEvent
	Image         = client.Image
	PullEvent     = client.PullEvent
	Error         = client.Error
	ForkRequest   = client.ForkRequest
	ForkResponse  = client.ForkResponse
)

// PullRequest is the body of POST /v0/images/pull.
type PullRequest struct {
	Image string `json:"image"`
}
