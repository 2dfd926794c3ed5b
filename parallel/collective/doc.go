// Package collective runs collectives on backend buffers (tensor.Buffer), the
// operands the model and the FSDP runtime hold: Group is what they call, and
// OnHost runs a comm.Communicator (in process or over TCP) on buffers of host
// memory, viewing their elements in place, with no copy and no read-back, as
// NCCL takes device pointers. Staged runs one on buffers of any memory through
// host copies (a counted read-back and an upload per collective): ranks that
// share a GPU, where NCCL refuses to run, and backends without collectives of
// their own. A device backend's collectives (NCCL) take their place behind the
// same interface.
//
// Dtypes: f32 buffers everywhere; the all-gather and the reduce-scatter also
// take bf16 buffers (bf16 bits travel unchanged; a bf16 reduce-scatter sums in
// fp32 and rounds once, as comm's bf16 collectives do).
package collective
