package main

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/shardline/shardline/parallel/comm"
	"github.com/shardline/shardline/trainer"
)

// jobEnv is a rank's place in a multi-process job, read from the variables the
// usual launchers set: torchrun and shardline launch (RANK, WORLD_SIZE), SLURM
// (SLURM_PROCID, SLURM_NTASKS) or Open MPI (OMPI_COMM_WORLD_RANK,
// OMPI_COMM_WORLD_SIZE), with MASTER_ADDR and MASTER_PORT for the rendezvous and
// SHARDLINE_JOB_TOKEN for its secret.
type jobEnv struct {
	rank, world int
	master      string
	token       string
	from        string // which launcher's variables were used
	// localRank is this process's index on its node (LOCAL_RANK,
	// SLURM_LOCALID, OMPI_COMM_WORLD_LOCAL_RANK), which picks its GPU; -1
	// when the launcher set none.
	localRank int
	// rendezvousFD is the bound rendezvous socket rank 0 inherited from shardline
	// launch (SHARDLINE_RENDEZVOUS_FD); 0 binds MASTER_PORT itself.
	rendezvousFD int
	// worldFlag names the flag the user gave the world size with, for messages
	// (shardline launch's --nproc, passed down as SHARDLINE_WORLD_FLAG); "" when
	// another launcher set WORLD_SIZE.
	worldFlag string
	// worldVar is the launcher's variable that gave the world size
	// (WORLD_SIZE, SLURM_NTASKS, OMPI_COMM_WORLD_SIZE), named in messages
	// when no flag of the user's did.
	worldVar string
}

// worldFlagEnv and launchLintedEnv are what shardline launch tells its ranks:
// the flag that set the world size (for messages), and that it has linted the
// recipe (so the ranks do not print its warnings N times).
const (
	worldFlagEnv    = "SHARDLINE_WORLD_FLAG"
	launchLintedEnv = "SHARDLINE_LAUNCH_LINTED"
)

// detectJob returns nil when the environment names no multi-process job.
func detectJob(env map[string]string) (*jobEnv, error) {
	for _, v := range [][4]string{{"RANK", "WORLD_SIZE", "torchrun", "LOCAL_RANK"}, {"SLURM_PROCID", "SLURM_NTASKS", "SLURM", "SLURM_LOCALID"},
		{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "mpirun", "OMPI_COMM_WORLD_LOCAL_RANK"}} {
		rs, ok1 := env[v[0]]
		ws, ok2 := env[v[1]]
		if !ok1 || !ok2 {
			continue
		}
		rank, err1 := strconv.Atoi(rs)
		world, err2 := strconv.Atoi(ws)
		if err1 != nil || err2 != nil || world < 1 || rank < 0 || rank >= world {
			return nil, usageErr("%s=%q and %s=%q (%s) do not name a rank of a world", v[0], rs, v[1], ws, v[2])
		}
		if world == 1 {
			return nil, nil
		}
		addr, port := env["MASTER_ADDR"], env["MASTER_PORT"]
		if addr == "" || port == "" {
			return nil, usageErr("%s names rank %d of %d but MASTER_ADDR and MASTER_PORT are not set: set them to rank 0's host and a free port", v[2], rank, world)
		}
		token := env["SHARDLINE_JOB_TOKEN"]
		if token == "" {
			return nil, usageErr("SHARDLINE_JOB_TOKEN is not set: give every rank of the job the same secret (shardline launch does)")
		}
		j := &jobEnv{rank: rank, world: world, master: net.JoinHostPort(addr, port), token: token, from: v[2], localRank: -1, worldFlag: env[worldFlagEnv], worldVar: v[1]}
		if ls, ok := env[v[3]]; ok {
			local, err := strconv.Atoi(ls)
			if err != nil || local < 0 || local > rank {
				return nil, usageErr("%s=%q (%s) is not this process's index on its node (0 to RANK, here %d)", v[3], ls, v[2], rank)
			}
			j.localRank = local
		}
		if fd := env["SHARDLINE_RENDEZVOUS_FD"]; fd != "" && rank == 0 {
			n, err := strconv.Atoi(fd)
			if err != nil || n < 3 {
				return nil, usageErr("SHARDLINE_RENDEZVOUS_FD=%q is not an inherited file descriptor (3 or more); shardline launch sets it, leave it unset otherwise", fd)
			}
			j.rendezvousFD = n
		}
		return j, nil
	}
	return nil, nil
}

// joinJob connects this process to the job over TCP.
func joinJob(j *jobEnv, timeout time.Duration) (*trainer.Process, func(), error) {
	cfg := comm.TCPConfig{Rank: j.rank, World: j.world, MasterAddr: j.master, Token: j.token, Timeout: timeout}
	if j.rendezvousFD > 0 {
		f := os.NewFile(uintptr(j.rendezvousFD), "rendezvous")
		ln, err := net.FileListener(f)
		f.Close() // the listener holds its own copy
		if err != nil {
			return nil, nil, fmt.Errorf("rank 0: the rendezvous socket passed down as file descriptor %d: %w", j.rendezvousFD, err)
		}
		cfg.Listener = ln
	}
	c, err := comm.DialTCP(cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("rank %d joining the job at %s: %w", j.rank, j.master, err)
	}
	return &trainer.Process{Rank: j.rank, World: j.world, Comm: c}, func() { c.Close() }, nil
}
