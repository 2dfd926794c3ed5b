package model

import (
	"fmt"

	"github.com/shardline/shardline/tensor"
)

// FP8 compute weights (SetFP8Weights; docs/engine.md, "FP8 parameters"):
// under precision.fp8.param_gather the trainer keeps the weights of the FP8
// products as E4M3 codes with one scale inverse per tensor, quantised from
// the fp32 main weights after each optimizer step (the whole tensor's amax)
// and all-gathered as codes. A product of a layer computing in FP8 then
// reads such a weight and its scale inverse as they are (fp8Weight): no
// quantisation of the weight in forward or backward, and the shared FP8
// weight copy goes unused.

// fp8Weights are the scale inverses of the FP8 compute weights: per
// parameter (table order; the empty Buffer for the others), and by the view
// last bound (Bind) to an FP8 parameter, which is how a product finds its
// weight's.
type fp8Weights struct {
	inv  []tensor.Buffer
	view map[tensor.Buffer]tensor.Buffer
}

// SetFP8Weights declares the FP8 compute weights: inv[i] (one f32 value in
// the model's memory) is parameter i's scale inverse, the empty Buffer for a
// parameter whose compute weight is not FP8. The views the model holds now
// and every view Bind gives such a parameter are then E4M3 codes, which the
// products of layers computing in FP8 read with that scale inverse; the
// weights' values and their scale inverses stay the caller's to update
// (between steps). It needs FP8 compute (WithFP8).
func (m *Model[F]) SetFP8Weights(inv []tensor.Buffer) error {
	if m.fp8 == nil {
		return fmt.Errorf("model: FP8 compute weights without FP8 compute (no layer computes in FP8)")
	}
	if len(inv) != len(m.wptr) {
		return fmt.Errorf("model: %d FP8 scale inverses for %d parameters", len(inv), len(m.wptr))
	}
	for i, b := range inv {
		if b.Len() > 0 && (b.Len() != 1 || b.DType() != tensor.Float32) {
			return fmt.Errorf("model: parameter %d's FP8 scale inverse is %d %s values: want one f32", i, b.Len(), b.DType())
		}
	}
	m.fp8w = &fp8Weights{inv: inv, view: map[tensor.Buffer]tensor.Buffer{}}
	for i, p := range m.wptr {
		if p != nil {
			m.noteFP8(i, *p)
		}
	}
	return nil
}

// noteFP8 records w, parameter i's view now, as an FP8 compute weight with
// the parameter's scale inverse (nothing for an empty view or another
// parameter). A view at a place another parameter's had (a gathered unit's
// buffer reused) takes the new parameter's.
func (m *Model[F]) noteFP8(i int, w tensor.Buffer) {
	f := m.fp8w
	if f == nil || f.inv[i].Len() == 0 || w.Len() == 0 {
		return
	}
	f.view[w] = f.inv[i]
}

// fp8Weight is what product pr of layer l, computing in FP8, reads for
// weight w and its scale inverse: w itself when it is an FP8 compute weight,
// else w quantised to E4M3 into the shared weight copy (under delayed
// scaling at its column's scale).
func (m *Model[F]) fp8Weight(l int, pr product, w tensor.Buffer) (tensor.Buffer, tensor.Buffer) {
	if f := m.fp8w; f != nil {
		if inv, ok := f.view[w]; ok {
			return w, inv
		}
	}
	p := m.fp8
	return m.quantize(p.w, p.wInv(), w, tensor.E4M3, m.fp8Col(l, 'w', int(pr))), p.wInv()
}
