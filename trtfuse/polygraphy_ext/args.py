"""The argument groups `polygraphy run` loads from the `polygraphy.run.plugins` entry point: `--trtfuse-onnxrt`
and `--trtfuse` runners, and the `--trtfuse-*` options they share. Each writes its loaders and runner into
Polygraphy's script, so `--gen-script` writes a script that imports them from `trtfuse.polygraphy_ext`."""

from __future__ import annotations

import argparse

from polygraphy.logger import G_LOGGER
from polygraphy.tools.args import ModelArgs, TrtConfigArgs
from polygraphy.tools.args import util as args_util
from polygraphy.tools.args.base import BaseArgs, BaseRunnerArgs
from polygraphy.tools.script import Script, make_invocable

from trtfuse.contract import PluginKind
from trtfuse.engine.profiles import PRESETS
from trtfuse.polygraphy_ext.preflight import run_problem

_MODULE = "trtfuse.polygraphy_ext"
# TrtConfigArgs options that change how `--trt` builds but that a trtfuse engine does not take: it is strongly
# typed (dtypes as the ONNX graph writes them) and builds exactly as `trtfuse compile` does.
_NOT_PASSED = ("fp16", "bf16", "fp8", "int8", "precision_constraints", "version_compatible", "refittable")


class TrtfuseArgs(BaseArgs):
    """
    trtfuse: fusing the model's RMSNorm and QK-norm chains with trtfuse and building its engine with the trtfuse plugins

    Depends on:

        - ModelArgs: the model, and the input shapes given
        - TrtConfigArgs: for --trtfuse, the profile shapes and build options that pass through
    """

    def add_parser_args_impl(self) -> None:
        self.group.add_argument(
            "--trtfuse-profile",
            dest="trtfuse_profiles",
            action="append",
            choices=sorted(PRESETS),
            default=None,
            help="A trtfuse profile preset for the --trtfuse engine, derived from the model's dims as `trtfuse compile "
            "--profile` does; repeat for several. Used when no --trt-min/opt/max-shapes are given; with them, the "
            "first preset sizes the inputs they leave out. [default: default]",
        )
        self.group.add_argument(
            "--trtfuse-plugins",
            dest="trtfuse_plugins",
            choices=[kind.value for kind in PluginKind],
            default=None,
            help="The plugin kind of the --trtfuse engine, as `trtfuse compile --plugins`: aot (kernels embedded, no "
            "Python needed to run it; TensorRT >= 10.14) or python (TensorRT >= 10.8). [default: aot with TensorRT "
            ">= 10.14, else python]",
        )
        self.group.add_argument(
            "--trtfuse-no-fuse-residual",
            dest="trtfuse_no_fuse_residual",
            action="store_true",
            default=None,
            help="Keep each residual Add outside the norm after it (fuse the norm alone as TrtfuseRmsNorm), as "
            "`trtfuse fuse --no-fuse-residual`: for a TensorRT build that folds the Add into the preceding GEMM.",
        )
        self.group.add_argument(
            "--trtfuse-no-fuse-quant",
            dest="trtfuse_no_fuse_quant",
            action="store_true",
            default=None,
            help="Keep every QuantizeLinear -> DequantizeLinear pair around a norm in the graph (no quantized trtfuse "
            "nodes), as `trtfuse fuse --no-fuse-quant`.",
        )
        self.group.add_argument(
            "--trtfuse-no-fuse-rope",
            dest="trtfuse_no_fuse_rope",
            action="store_true",
            default=None,
            help="Keep the rotary embedding after each QK-norm pair in the graph (no TrtfuseQkNormRope), as "
            "`trtfuse fuse --no-fuse-rope`.",
        )
        self.group.add_argument(
            "--trtfuse-cache",
            dest="trtfuse_cache",
            metavar="DIR",
            default=None,
            help="Folder for the fused model, its report and the --trtfuse engine, one subfolder per fused model, "
            "profiles and build options; an engine found there is used again. "
            "[default: $TRTFUSE_ENGINE_CACHE or ~/.cache/trtfuse/engines]",
        )

    def parse_impl(self, args: argparse.Namespace) -> None:
        """
        Parses command-line arguments and populates the following attributes:

        Attributes:
            presets (List[str]): The trtfuse profile presets.
            plugins (str): The plugin kind of the engine ("aot" or "python"), or None for the default.
            cache_dir (str): The folder for fused models and engines, or None for the default.
            fuse_residual (bool): Whether residual Adds are fused into the norms after them (False with
                    --trtfuse-no-fuse-residual), or None for the default (they are).
            fuse_quant (bool): Whether the Q/DQ pairs around a norm go into its node (False with
                    --trtfuse-no-fuse-quant), or None for the default (they do).
            fuse_rope (bool): Whether the rotary embedding after a QK-norm pair goes into its node (False with
                    --trtfuse-no-fuse-rope), or None for the default (it does).
            polygraphy_profiles (List[Dict[str, List[List[int]]]]):
                    Per profile given with --trt-min/opt/max-shapes, each input's [MIN, OPT, MAX] shapes; empty when
                    none was given (Polygraphy's profile from --input-shapes alone is not one).
            not_passed (List[str]): The TensorRT build options given that the trtfuse engine does not take.
        """
        self.presets = args_util.get(args, "trtfuse_profiles") or []
        self.plugins = args_util.get(args, "trtfuse_plugins")
        self.cache_dir = args_util.get(args, "trtfuse_cache")
        self.fuse_residual = False if args_util.get(args, "trtfuse_no_fuse_residual") else None
        self.fuse_quant = False if args_util.get(args, "trtfuse_no_fuse_quant") else None
        self.fuse_rope = False if args_util.get(args, "trtfuse_no_fuse_rope") else None
        given = any(args_util.get(args, f"trt_{bound}_shapes") for bound in ("min", "opt", "max"))
        config = self.arg_groups[TrtConfigArgs]
        self.polygraphy_profiles = []
        if given:
            self.polygraphy_profiles = [
                {name: [list(bound) for bound in bounds] for name, bounds in profile.items()}
                for profile in config.profile_dicts
            ]
        self.not_passed = [f"--{name.replace('_', '-')}" for name in _NOT_PASSED if getattr(config, name, None)]
        self._refuse_what_would_fail(args)

    def _refuse_what_would_fail(self, args: argparse.Namespace) -> None:
        """One critical line, as for a bad argument, where a selected runner, Polygraphy's own included, would fail
        on the model in a traceback (`preflight.run_problem`): parsing is the last point before the runners run."""
        model = self.arg_groups[ModelArgs]
        runners = args_util.get(args, "runners") or []
        if not runners or model.path is None or model.model_type is None or not model.model_type.is_onnx():
            return
        sized = bool(model.input_shapes) or any(
            args_util.get(args, name) for name in ("load_inputs_paths", "data_loader_script")
        )
        problem = run_problem(model.path, runners, sized)
        if problem is not None:
            G_LOGGER.critical(f"trtfuse: {problem}")

    def add_to_script_impl(self, script: Script) -> str:
        """Adds the loader that fuses the model; returns its name."""
        script.add_import(imports=["FuseModel"], frm=_MODULE)
        loader = make_invocable(
            "FuseModel",
            self.arg_groups[ModelArgs].path,
            fuse_residual=self.fuse_residual,
            fuse_quant=self.fuse_quant,
            fuse_rope=self.fuse_rope,
        )
        return script.add_loader(loader, "fuse_with_trtfuse")

    def add_engine_to_script(self, script: Script) -> str:
        """Adds the loaders that fuse the model and build its engine; returns the name of the engine loader."""
        for option in self.not_passed:
            G_LOGGER.warning(
                f"trtfuse: {option} does not apply to the --trtfuse engine (built as `trtfuse compile` does)"
            )
        fused = self.add_to_script(script)
        config = self.arg_groups[TrtConfigArgs]
        script.add_import(imports=["BuildTrtfuseEngine"], frm=_MODULE)
        return script.add_loader(
            make_invocable(
                "BuildTrtfuseEngine",
                fused,
                presets=self.presets or None,
                profiles=self.polygraphy_profiles or None,
                cache_dir=self.cache_dir,
                optimization_level=config.builder_optimization_level,
                workspace_bytes=_workspace_bytes(config),
                timing_cache=config.load_timing_cache,
                allow_tf32=config.tf32 or None,
                plugins=self.plugins,
            ),
            "build_trtfuse_engine",
        )


def _workspace_bytes(config: TrtConfigArgs) -> int | None:
    # TrtConfigArgs keys its pool limits by the script text of the TensorRT enum, e.g. `trt.MemoryPoolType.WORKSPACE`.
    limits = config.memory_pool_limits or {}
    return next((size for pool, size in limits.items() if str(pool).endswith(".WORKSPACE")), None)


class TrtfuseOnnxrtRunnerArgs(BaseRunnerArgs):
    """
    trtfuse Fused Model in ONNX-Runtime: running the trtfuse-fused model, plugin nodes lowered, in ONNX-Runtime

    Depends on:

        - TrtfuseArgs
    """

    def get_name_opt_impl(self) -> tuple[str, str]:
        return "the trtfuse-fused model lowered to standard ops in ONNX-Runtime", "trtfuse-onnxrt"

    def get_extra_help_text_impl(self) -> str:
        return "Runs as `trtfuse check` runs the fused model (CPU, no graph optimisations)."

    def add_to_script_impl(self, script: Script) -> None:
        fused = self.arg_groups[TrtfuseArgs].add_to_script(script)
        script.add_import(imports=["LowerFusedNodes", "FusedOnnxrtRunner"], frm=_MODULE)
        lowered = script.add_loader(make_invocable("LowerFusedNodes", fused), "lower_fused_nodes")
        script.add_runner(make_invocable("FusedOnnxrtRunner", lowered))


class TrtfuseRunnerArgs(BaseRunnerArgs):
    """
    trtfuse TensorRT Engine: running the trtfuse engine, built with the trtfuse plugins, in TensorRT

    Depends on:

        - TrtfuseArgs
    """

    def get_name_opt_impl(self) -> tuple[str, str]:
        return "the trtfuse engine (fused model and trtfuse plugins) in TensorRT", "trtfuse"

    def get_extra_help_text_impl(self) -> str:
        return "Builds it as `trtfuse compile` does; needs TensorRT and an NVIDIA GPU."

    def add_to_script_impl(self, script: Script) -> None:
        engine = self.arg_groups[TrtfuseArgs].add_engine_to_script(script)
        script.add_import(imports=["TrtfuseTrtRunner"], frm=_MODULE)
        script.add_runner(make_invocable("TrtfuseTrtRunner", engine))


def export_argument_groups() -> list[BaseArgs]:
    """The entry point of `polygraphy.run.plugins`."""
    return [TrtfuseArgs(), TrtfuseOnnxrtRunnerArgs(), TrtfuseRunnerArgs()]
