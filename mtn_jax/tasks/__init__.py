"""Tasks: what each kind of model learns and how it suggests (`base`), the `losses`, the
`rankers`, the zero attention family (`zero_attention`), IMDNA (`multi_answer`), and the table
of which task serves which model (`registry`). The names most callers need are re-exported
here."""

from mtn_jax.tasks.base import AnswersQuestions
from mtn_jax.tasks.base import AttendsToMemory
from mtn_jax.tasks.base import BringsOwnData
from mtn_jax.tasks.base import GenerationTask
from mtn_jax.tasks.base import RankingTask
from mtn_jax.tasks.base import ScoresCandidates
from mtn_jax.tasks.base import ScoresPool
from mtn_jax.tasks.base import Suggests
from mtn_jax.tasks.base import SplitInputs
from mtn_jax.tasks.base import Task
from mtn_jax.tasks.base import TrainingData
from mtn_jax.tasks.registry import make_task
from mtn_jax.tasks.registry import task_class

__all__ = [
    'AnswersQuestions',
    'AttendsToMemory',
    'BringsOwnData',
    'GenerationTask',
    'RankingTask',
    'ScoresCandidates',
    'ScoresPool',
    'SplitInputs',
    'Suggests',
    'Task',
    'TrainingData',
    'make_task',
    'task_class',
]
