package sim

import (
	"errors"
	"fmt"
	"sort"
)

// Errors of the physics catalogue; check with errors.Is.
var (
	// ErrUnknownGPU: the GPU name is not in the catalogue (see GPUNames).
	ErrUnknownGPU = errors.New("sim: unknown GPU")
	// ErrUnknownModel: the model name is not in the catalogue (see
	// ModelNames).
	ErrUnknownModel = errors.New("sim: unknown model")
	// ErrBadPhysicsSpec: a PhysicsSpec that cannot describe a vLLM engine
	// (tensor parallelism below 1, an unknown KV-cache dtype, a model that
	// does not fit the GPUs' memory).
	ErrBadPhysicsSpec = errors.New("sim: bad physics spec")
)

// Names of the catalogue GPUs.
const (
	GPURTXPro6000 = "rtx-pro-6000"
	GPUH100SXM    = "h100-sxm"
	GPUH200SXM    = "h200-sxm"
	GPUA10080GB   = "a100-80gb"
)

// Names of the catalogue models.
const (
	ModelLlama31_70BAWQ = "llama-3.1-70b-awq"
	ModelLlama33_70BFP8 = "llama-3.3-70b-fp8"
	ModelLlama31_8B     = "llama-3.1-8b"
)

// Dtype names a number format.
type Dtype string

// Dtypes of weights, compute and the KV cache.
const (
	DtypeFP16 Dtype = "fp16" // also stands for bf16: same size and tensor-core rate
	DtypeFP8  Dtype = "fp8"
	DtypeINT4 Dtype = "int4"
)

// Bytes is the size of one element; INT4 is half a byte.
func (d Dtype) Bytes() float64 {
	switch d {
	case DtypeFP16:
		return 2
	case DtypeFP8:
		return 1
	case DtypeINT4:
		return 0.5
	}
	return 0
}

// GPUSpec is one GPU model from its public spec sheet: the figures the
// roofline needs and the identity the fake dcgm-exporter reports.
type GPUSpec struct {
	// Name is the catalogue name (GPUH100SXM, ...).
	Name string
	// MemoryBytes is the frame buffer as nvidia-smi reports it.
	MemoryBytes int64
	// MemBandwidth is the peak memory bandwidth in bytes/s.
	MemBandwidth float64
	// FP16FLOPS and FP8FLOPS are the dense (no sparsity) tensor-core peaks
	// in FLOP/s; FP8FLOPS is 0 where the GPU has no FP8 tensor cores.
	FP16FLOPS, FP8FLOPS float64
	// LinkBandwidth is the GPU-to-GPU bandwidth per direction in bytes/s
	// (NVLink, or PCIe where the GPU has none) that tensor-parallel
	// all-reduces use.
	LinkBandwidth float64
	// DCGM is the identity and power/clock envelope the simulated GPU
	// reports (MemoryMiB from MemoryBytes; WeightsMiB is filled in per
	// model by PhysicsProfile).
	DCGM GPUProfile
}

// ModelSpec is one model from its Hugging Face config: the figures the
// roofline and the KV-cache sizing need.
type ModelSpec struct {
	// Name is the catalogue name (ModelLlama31_70BAWQ, ...).
	Name string
	// Params is the parameter count.
	Params float64
	// WeightBytes is the size of the loaded weights, all TP ranks together.
	WeightBytes float64
	// Layers, QHeads, KVHeads, HeadDim, Hidden and Intermediate are the
	// transformer's shape (num_hidden_layers, num_attention_heads,
	// num_key_value_heads, head_dim, hidden_size, intermediate_size).
	Layers, QHeads, KVHeads, HeadDim, Hidden, Intermediate int
	// MaxContext is max_position_embeddings.
	MaxContext int
	// Weights is the weight dtype, Compute the dtype of the matrix
	// multiplications (AWQ dequantises INT4 weights to fp16 and multiplies
	// in fp16; an FP8 checkpoint multiplies in FP8 where the GPU can).
	Weights, Compute Dtype
}

// KVBytesPerToken is the KV cache of one token for the whole model (all TP
// ranks): layers × kv_heads × head_dim × 2 (K and V) × dtype bytes.
func (m ModelSpec) KVBytesPerToken(kv Dtype) float64 {
	return float64(m.Layers*m.KVHeads*m.HeadDim*2) * kv.Bytes()
}

const mib = 1 << 20

// LookupGPU returns the catalogue GPU with the given name, or an error
// wrapping ErrUnknownGPU that lists the catalogue.
//
// Figures (peak, dense, per GPU) from the public spec sheets:
//
//   - rtx-pro-6000: NVIDIA RTX PRO 6000 Blackwell Server Edition (GB202,
//     188 SMs): 96 GB GDDR7 on a 512-bit bus at 28 Gbps = 1,792 GB/s; 600 W
//     (configurable down to 400 W); boost clock 2,617 MHz; tensor cores
//     503.8 TFLOPS dense FP16/BF16 (FP32 accumulate), 1.01 PFLOPS dense FP8
//     (the datasheet's "4 PFLOPS FP4" is sparse FP4); no NVLink, PCIe Gen5
//     x16 (64 GB/s per direction). nvidia-smi reports 97,887 MiB.
//   - h100-sxm: NVIDIA H100 SXM5 80 GB HBM3: 3.35 TB/s; 989.4 TFLOPS dense
//     BF16/FP16, 1,978.9 dense FP8 (3,958 with sparsity); 700 W; boost
//     1,980 MHz; NVLink 4 900 GB/s total (450 GB/s per direction).
//     nvidia-smi reports 81,559 MiB.
//   - h200-sxm: NVIDIA H200 SXM 141 GB HBM3e: 4.8 TB/s; the same GH100
//     compute as the H100 SXM (989.4 / 1,978.9 TFLOPS dense); 700 W; NVLink
//     900 GB/s. nvidia-smi reports 143,771 MiB.
//   - a100-80gb: NVIDIA A100 SXM4 80 GB HBM2e: 2,039 GB/s; 312 TFLOPS dense
//     BF16/FP16, no FP8 tensor cores (FP8 checkpoints run as W8A16 in fp16);
//     400 W; boost 1,410 MHz; NVLink 3 600 GB/s total (300 per direction).
//     nvidia-smi reports 81,920 MiB.
func LookupGPU(name string) (GPUSpec, error) {
	switch name {
	case GPURTXPro6000:
		return GPUSpec{
			Name: name, MemoryBytes: 97887 * mib, MemBandwidth: 1792e9,
			FP16FLOPS: 503.8e12, FP8FLOPS: 1007.6e12, LinkBandwidth: 64e9,
			DCGM: GPUProfile{
				ModelName: "NVIDIA RTX PRO 6000 Blackwell Server Edition", MemoryMiB: 97887,
				MemoryUtilization: 0.90, IdleWatts: 35, MaxWatts: 600,
				IdleSMClockMHz: 180, MaxSMClockMHz: 2617, MemClockMHz: 14001,
				AmbientC: 30, LoadRiseC: 45,
			},
		}, nil
	case GPUH100SXM:
		return GPUSpec{
			Name: name, MemoryBytes: 81559 * mib, MemBandwidth: 3.35e12,
			FP16FLOPS: 989.4e12, FP8FLOPS: 1978.9e12, LinkBandwidth: 450e9,
			DCGM: GPUProfile{
				ModelName: "NVIDIA H100 80GB HBM3", MemoryMiB: 81559,
				MemoryUtilization: 0.90, IdleWatts: 70, MaxWatts: 700,
				IdleSMClockMHz: 345, MaxSMClockMHz: 1980, MemClockMHz: 2619,
				AmbientC: 30, LoadRiseC: 40,
			},
		}, nil
	case GPUH200SXM:
		return GPUSpec{
			Name: name, MemoryBytes: 143771 * mib, MemBandwidth: 4.8e12,
			FP16FLOPS: 989.4e12, FP8FLOPS: 1978.9e12, LinkBandwidth: 450e9,
			DCGM: GPUProfile{
				ModelName: "NVIDIA H200", MemoryMiB: 143771,
				MemoryUtilization: 0.90, IdleWatts: 75, MaxWatts: 700,
				IdleSMClockMHz: 345, MaxSMClockMHz: 1980, MemClockMHz: 3201,
				AmbientC: 30, LoadRiseC: 40,
			},
		}, nil
	case GPUA10080GB:
		g := a100
		g.WeightsMiB = 0
		return GPUSpec{
			Name: name, MemoryBytes: 81920 * mib, MemBandwidth: 2.039e12,
			FP16FLOPS: 312e12, FP8FLOPS: 0, LinkBandwidth: 300e9,
			DCGM: g,
		}, nil
	}
	return GPUSpec{}, fmt.Errorf("%w %q: want one of %v", ErrUnknownGPU, name, GPUNames())
}

// GPUNames lists the catalogue GPUs, sorted.
func GPUNames() []string {
	n := []string{GPURTXPro6000, GPUH100SXM, GPUH200SXM, GPUA10080GB}
	sort.Strings(n)
	return n
}

// LookupModel returns the catalogue model with the given name, or an error
// wrapping ErrUnknownModel that lists the catalogue.
//
// Shapes are those of the models' config.json (Llama 3.1/3.3 70B: 80
// layers, 64 query and 8 KV heads of 128, hidden 8192, intermediate 28672;
// Llama 3.1 8B: 32 layers, 32 query and 8 KV heads of 128, hidden 4096,
// intermediate 14336; both 131072 positions). Weight sizes: the 70B AWQ
// INT4 checkpoint (group size 128, fp16 embeddings and lm_head) loads as
// about 37 GiB; the 70B FP8 checkpoint (FP8 linear layers, bf16 embeddings
// and lm_head) as 68.5 GB + 4.2 GB; the 8B in bf16 as 16.1 GB.
func LookupModel(name string) (ModelSpec, error) {
	llama70 := ModelSpec{
		Name: name, Params: 70.6e9, Layers: 80, QHeads: 64, KVHeads: 8, HeadDim: 128,
		Hidden: 8192, Intermediate: 28672, MaxContext: 131072,
	}
	switch name {
	case ModelLlama31_70BAWQ:
		m := llama70
		m.WeightBytes = 37 * (1 << 30)
		m.Weights, m.Compute = DtypeINT4, DtypeFP16
		return m, nil
	case ModelLlama33_70BFP8:
		m := llama70
		m.WeightBytes = 72.7e9
		m.Weights, m.Compute = DtypeFP8, DtypeFP8
		return m, nil
	case ModelLlama31_8B:
		return ModelSpec{
			Name: name, Params: 8.03e9, WeightBytes: 16.06e9, Layers: 32, QHeads: 32, KVHeads: 8,
			HeadDim: 128, Hidden: 4096, Intermediate: 14336, MaxContext: 131072,
			Weights: DtypeFP16, Compute: DtypeFP16,
		}, nil
	}
	return ModelSpec{}, fmt.Errorf("%w %q: want one of %v", ErrUnknownModel, name, ModelNames())
}

// ModelNames lists the catalogue models, sorted.
func ModelNames() []string {
	n := []string{ModelLlama31_70BAWQ, ModelLlama33_70BFP8, ModelLlama31_8B}
	sort.Strings(n)
	return n
}

// KVDtypeNames lists the accepted KV-cache dtypes (vLLM --kv-cache-dtype
// auto for these models is fp16/bf16).
func KVDtypeNames() []string { return []string{string(DtypeFP16), string(DtypeFP8)} }

// vllmSchedulerDefaults returns vLLM V1's max_num_seqs and
// max_num_batched_tokens for the OpenAI API server on this GPU, as
// EngineArgs sets them by usage context (vllm/engine/arg_utils.py,
// get_batch_defaults): a GPU with at least 70 GiB whose name does not
// contain "a100" gets 1024 sequences and 8192 tokens ("for GPUs like H100
// and MI300x"); every other GPU, the A100 included ("setting large
// max_num_batched_tokens for A100 reduces throughput", vLLM PR #17885),
// gets 256 and 2048. (Later releases add a 16384-token tier for GPUs with
// at least 160 GiB; no catalogue GPU reaches it.)
func vllmSchedulerDefaults(g GPUSpec) (maxNumSeqs, maxBatchedTokens int) {
	if g.MemoryBytes >= 70*(1<<30) && g.Name != GPUA10080GB {
		return 1024, 8192
	}
	return 256, 2048
}
