//go:build cuda || cudaemu

package cuda

import (
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/shardline/shardline/parallel/collective"
	"github.com/shardline/shardline/parallel/comm"
	"github.com/shardline/shardline/tensor"
)

// Collectives makes c's group on m's buffers over NCCL (collective.Native):
// the members exchange their devices' UUIDs over c (the job's host
// communicator), and where every member has a GPU of its own, rank 0 of c
// makes the NCCL unique id, c carries it to the others (comm.BroadcastBytes:
// the job's token, timeouts and lost-rank errors), and each joins the
// communicator. Where two members share a GPU it returns no group and says
// which (NCCL refuses two ranks on one device; the caller stages c through
// the host). A member that cannot load NCCL fails the call on every member,
// naming itself, unless it is the group's only member (staged then: a group
// of one only copies). close destroys the communicator.
func (m *Memory) Collectives(c comm.Communicator) (collective.Group, func(), string, error) {
	// Per member: its device's UUID (16 bytes as exact float32 values),
	// whether it loaded NCCL, and its process id (below 2²⁴ on Linux, so exact
	// too): the emulator's NCCL joins the ranks of one process only.
	const w = 18
	loadErr := loadNCCL()
	mine := make([]float32, w)
	u := m.d.UUID()
	for i, b := range u {
		mine[i] = float32(b)
	}
	if loadErr == nil {
		mine[16] = 1
	}
	mine[17] = float32(os.Getpid() % (1 << 24))
	all := make([]float32, w*c.Size())
	if err := c.AllGather(all, mine); err != nil {
		return nil, nil, "", fmt.Errorf("exchanging the ranks' GPUs: %w", err)
	}
	seen := map[[16]byte]int{}
	var shared []string
	var lacking []int
	for r := 0; r < c.Size(); r++ {
		var id [16]byte
		for i := range id {
			id[i] = byte(all[r*w+i])
		}
		if q, ok := seen[id]; ok {
			shared = append(shared, fmt.Sprintf("members %d and %d share GPU %x", q, r, id[:]))
		} else {
			seen[id] = r
		}
		if all[r*w+16] != 1 {
			lacking = append(lacking, r)
		}
		if !ncclSpansProcesses && all[r*w+17] != all[17] {
			shared = append(shared, fmt.Sprintf("members 0 and %d are processes apart, and the host emulator's NCCL joins the ranks of one process", r))
		}
	}
	if len(shared) > 0 {
		return nil, nil, strings.Join(shared, "; "), nil
	}
	if loadErr != nil && c.Size() == 1 {
		return nil, nil, fmt.Sprintf("a group of one, and %v", loadErr), nil // it needs no NCCL
	}
	if loadErr != nil {
		return nil, nil, "", loadErr
	}
	if len(lacking) > 0 {
		return nil, nil, "", fmt.Errorf("members %v of this group cannot load NCCL (their logs say why): every rank with a GPU of its own needs it", lacking)
	}
	// Rank 0's id, after a byte that says whether it could make one (so no
	// member joins a communicator that rank 0 never made).
	id := make([]byte, 1+UniqueIDBytes)
	var idErr error
	if c.Rank() == 0 {
		made, err := NewUniqueID()
		if idErr = err; err == nil {
			id[0] = 1
			copy(id[1:], made)
		}
	}
	if err := comm.BroadcastBytes(c, id, 0); err != nil {
		return nil, nil, "", fmt.Errorf("handing out the NCCL unique id: %w", err)
	}
	if idErr != nil {
		return nil, nil, "", idErr
	}
	if id[0] != 1 {
		return nil, nil, "", fmt.Errorf("member 0 of the group could not make the NCCL unique id (its log says why)")
	}
	var nc *Comm
	var err error
	m.d.run(func() { nc, err = m.d.NewComm(id[1:], c.Size(), c.Rank()) })
	if err != nil {
		return nil, nil, "", err
	}
	g, err := m.Group(nc)
	if err != nil {
		return nil, nil, "", err
	}
	closeAll := func() {
		g.Close()
		m.d.run(func() { m.d.fail("closing an NCCL communicator", nc.Close()) })
	}
	return g, closeAll, "", nil
}

// AllocRegistered allocates n zeroed values of t as an NCCL user buffer
// registered with every one of groups' communicators (collective.Registered;
// groups are NCCL groups this memory made). Free deregisters and frees it.
func (m *Memory) AllocRegistered(t tensor.DType, n int, groups []collective.Group) (tensor.Buffer, error) {
	var comms []*Comm
	for _, g := range groups {
		ng, ok := g.(*Group)
		if !ok || ng.m != m {
			return tensor.Buffer{}, fmt.Errorf("cuda: registering a user buffer with a group that is not an NCCL group of this memory")
		}
		if !slices.Contains(comms, ng.c) {
			comms = append(comms, ng.c)
		}
	}
	var b Buffer
	var err error
	m.d.run(func() {
		if b, err = m.d.AllocUserBuffer(comms, t, n); err == nil {
			m.d.Zero(b)
		}
	})
	if err != nil {
		return tensor.Buffer{}, err
	}
	s := &storage{buf: b, mem: m}
	s.release = func() { m.d.FreeUserBuffer(comms, b) }
	return tensor.NewBuffer(s, 0, n), nil
}

var (
	_ collective.Registered = (*Memory)(nil)
	_ collective.Native     = (*Memory)(nil)
	_ collective.Timed      = (*Memory)(nil)
)
