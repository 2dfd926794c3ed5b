// Package collective runs collectives on backend buffers (tensor.Buffer), the
// operands the model and the FSDP runtime hold: Group is what they call, and
// OnHost runs a comm.Communicator (in process or over TCP) on buffers of host
// memory, viewing their elements in place, with no copy and no read-back, as
// NCCL takes device pointers. A device backend's collectives take OnHost's
// place behind the same interface.
//
// Dtypes: f32 buffers everywhere; the all-gather and the reduce-scatter also
// take bf16 buffers (bf16 bits travel unchanged; a bf16 reduce-scatter sums in
// fp32 and rounds once, as comm's bf16 collectives do).
package collective
