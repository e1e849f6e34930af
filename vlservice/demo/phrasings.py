"""How people ask the demo model's questions: many phrasings per question and language.

The demo model used to know one wording per question (the preset's), so "What is in this image?"
or "What shape is on the left?" were questions it had never seen. Training now draws its questions
from `TRAIN`; `HELD_OUT` holds further phrasings that no training run sees (nor the tokenizer's
corpus), so `eval-demo` can say how the model does on wordings it was not taught.

Both are written the way people ask (short and long, questions and imperatives, with and without
"image"/"picture"/"photo", polite and terse), not to match a list. Keys are the question kinds of
`vlservice.demo.data`; `{shape}` is a shape's name ("circle" / "圆形") and `{object}` a shape's
name with or without its colour ("red circle", "circle" / "红色的圆形", "圆形"). The first phrasing
of a kind that has a preset is that preset, byte for byte (`prompts.PROMPTS`).
"""

from __future__ import annotations

from .prompts import PROMPTS, VIDEO_PRESETS

TRAIN: dict[str, dict[str, tuple[str, ...]]] = {
    "en": {
        "describe": (
            PROMPTS["en"]["describe"], "What is in this image?", "What do you see?", "Describe the picture.",
            "What's in the photo?", "Can you describe this image for me?", "What does this picture show?",
            "Tell me what you see in the image.", "What is this?", "Describe it.",
            "Give a short description of this photo.", "What shapes are in this picture?",
            "Please describe what is shown here.", "What can you see in this image?",
        ),
        "ocr": (
            PROMPTS["en"]["ocr"], "What does the text say?", "Read the text.", "What is written here?",
            "What does it say?", "Transcribe the text in the picture.", "What's written on the card?",
            "Read this.", "Can you read the text in this photo?", "What text is in this image?",
            "Please read out the words in the image.", "OCR this image.", "What does the card say?",
        ),
        "count": (
            PROMPTS["en"]["count"], "How many shapes?", "Count the shapes.", "How many objects are in this image?",
            "Count the objects in the picture.", "How many things can you see?", "Number of shapes?",
            "How many shapes are in the photo?", "Tell me how many shapes there are.",
            "How many figures do you see in this image?", "Can you count the shapes in this picture?",
            "How many shapes are there in the image?",
        ),
        "color": (
            PROMPTS["en"]["color"], "What colour is the {shape}?", "Which color is the {shape}?",
            "Tell me the color of the {shape}.", "The {shape} is what color?",
            "What's the colour of the {shape} in this picture?", "What color is the {shape} in the image?",
            "Color of the {shape}?", "What colour is the {shape} in this photo?",
            "Can you tell me what color the {shape} is?", "Name the color of the {shape}.",
        ),
        "position_left": (
            PROMPTS["en"]["position_left"], "What is the leftmost shape?", "What shape is on the left?",
            "Which shape is furthest to the left?", "Name the shape on the left.",
            "What's on the left side of the image?", "Tell me which shape is on the left.",
            "What is the shape on the far left?", "Which object is leftmost in the picture?",
            "Identify the leftmost shape.", "What is on the left of the photo?",
        ),
        "position_right": (
            PROMPTS["en"]["position_right"], "What is the rightmost shape?", "What shape is on the right?",
            "Which shape is furthest to the right?", "Name the shape on the right.",
            "What's on the right side of the image?", "Tell me which shape is on the right.",
            "What is the shape on the far right?", "Which object is rightmost in the picture?",
            "Identify the rightmost shape.", "What is on the right of the photo?",
        ),
        "locate": (
            PROMPTS["en"]["locate"], "Locate every shape.", "Where are the shapes?",
            "Find all the shapes and give their bounding boxes.", "Detect all objects in the image.",
            "Give me the bounding box of every shape.", "Mark each shape with a box.",
            "Output the bounding boxes of all shapes in JSON.", "Find every object in this picture.",
            "Locate all the shapes in the photo.", "Draw boxes around the shapes.",
        ),
        "locate_one": (
            "Where is the {object}?", "Locate the {object}.", "Find the {object}.",
            "Give the bounding box of the {object}.", "Where's the {object} in this image?",
            "Point out the {object}.", "Show me where the {object} is.", "Box the {object}.",
            "Find the {object} in the picture and report its bounding box in JSON.", "Detect the {object}.",
            "Where is the {object} in the photo?",
        ),
        "describe_video": (
            VIDEO_PRESETS["describe_video"]["en"], "What happens in this video?", "What happens in the clip?",
            "Describe the clip.", "What is going on in this video?", "Tell me what happens in the video.",
            "What does the video show?", "Summarize this video.", "What do you see in this clip?",
            "Explain what happens.", "Describe what happens in this clip.",
        ),
    },
    "zh": {
        "describe": (
            PROMPTS["zh"]["describe"], "图片里有什么？", "你看到了什么？", "描述一下这幅图。", "照片里有什么？",
            "请描述这张图。", "这张图片显示了什么？", "说说图中有什么。", "这是什么？", "描述一下。",
            "简单描述这张照片。", "图中有哪些图形？", "请说明图片的内容。",
        ),
        "ocr": (
            PROMPTS["zh"]["ocr"], "上面写着什么？", "图片里写的是什么？", "识别图中的文字。", "这张卡片上写了什么？",
            "读一下文字。", "图中的文字是什么？", "把图片中的文字读出来。", "照片上写着什么字？",
            "请识别这张图片里的文字。", "文字内容是什么？", "卡片上是什么字？",
        ),
        "count": (
            PROMPTS["zh"]["count"], "有几个图形？", "数一数图形。", "图片里有多少个物体？", "数一下图中的图形。",
            "能看到几个东西？", "图形的数量是多少？", "照片中有几个图形？", "告诉我有多少个图形。",
            "这张图里一共有几个形状？", "请数一数图片中的图形。",
        ),
        "color": (
            PROMPTS["zh"]["color"], "{shape}是什么颜色的？", "这个{shape}是什么颜色？", "图中{shape}的颜色是什么？",
            "告诉我{shape}的颜色。", "{shape}什么颜色？", "请问图片里的{shape}是什么颜色？", "{shape}是啥颜色？",
            "说一下{shape}的颜色。", "照片中的{shape}是什么颜色的？", "{shape}的颜色？",
        ),
        "position_left": (
            PROMPTS["zh"]["position_left"], "左边是什么？", "最左边是什么形状？", "图片最左侧的图形是什么？",
            "左边的图形是什么？", "哪个图形在最左边？", "说出最左边的图形。", "靠左的是哪个图形？",
            "照片里最左面的是什么？", "最左边那个是什么？", "左侧是什么图形？",
        ),
        "position_right": (
            PROMPTS["zh"]["position_right"], "右边是什么？", "最右边是什么形状？", "图片最右侧的图形是什么？",
            "右边的图形是什么？", "哪个图形在最右边？", "说出最右边的图形。", "靠右的是哪个图形？",
            "照片里最右面的是什么？", "最右边那个是什么？", "右侧是什么图形？",
        ),
        "locate": (
            PROMPTS["zh"]["locate"], "找出所有图形。", "每个图形在哪里？", "检测图中的所有物体。",
            "给出每个图形的边界框。", "框出图片中的所有图形。", "定位图中的每个图形。", "用JSON给出所有图形的位置。",
            "图形都在哪里？", "标出照片里的每个物体。", "找出图中的全部形状并给出坐标。",
        ),
        "locate_one": (
            "{object}在哪里？", "找出{object}。", "定位{object}。", "给出{object}的边界框。", "图中{object}在什么位置？",
            "框出{object}。", "{object}在图片的哪个位置？", "请找到照片里的{object}。", "标出{object}的位置。",
            "用 JSON 给出{object}的边界框。", "{object}在哪？",
        ),
        "describe_video": (
            VIDEO_PRESETS["describe_video"]["zh"], "视频里发生了什么？", "这段视频讲了什么？", "描述一下这个视频。",
            "视频中有什么变化？", "说说视频里发生的事。", "这个片段里发生了什么？", "请描述这段视频的内容。",
            "视频显示了什么？", "简单描述这个视频。", "讲讲这段视频。",
        ),
    },
}

# Never trained on, never in the tokenizer's corpus: the held-out phrasings of eval-demo.
HELD_OUT: dict[str, dict[str, tuple[str, ...]]] = {
    "en": {
        "describe": ("What shape is this?", "What's going on in this picture?", "Explain what the image shows.",
                     "Could you tell me what's in the photo?", "What am I looking at?", "Describe what you see."),
        "ocr": ("What is written on it?", "Can you tell me what the text says?", "Read the card for me.",
                "What words or numbers are in this picture?", "Transcribe this.", "What does the sign say?"),
        "count": ("How many shapes can you count in the picture?", "Could you count the shapes for me?",
                  "What is the number of shapes in this photo?", "Count how many objects there are.",
                  "How many are there?", "How many shapes do you see?"),
        "color": ("What color does the {shape} have?", "Which colour is the {shape} in the photo?",
                  "Tell me what colour the {shape} is.", "What is the color of the {shape}?",
                  "The {shape}: what colour?", "What color is that {shape}?"),
        "position_left": ("Which one is on the left?", "What do you see on the left?", "Left-most shape?",
                          "What's the left-most object in this photo?", "Which shape is at the left end?",
                          "Tell me the shape on the left side of the picture."),
        "position_right": ("Which one is on the right?", "What do you see on the right?", "Right-most shape?",
                           "What's the right-most object in this photo?", "Which shape is at the right end?",
                           "Tell me the shape on the right side of the picture."),
        "locate": ("Find the objects in this image and give bounding boxes.", "Where is each shape?",
                   "Give me boxes for all the objects.", "Detect every shape in the picture.",
                   "Locate the shapes.", "Show the bounding boxes of the objects in this photo."),
        "locate_one": ("Can you find the {object}?", "Where can I see the {object}?",
                       "Give me the box of the {object}.", "Locate the {object} in the image.",
                       "Where is the {object} located?", "Find the {object} and give its bounding box."),
        "describe_video": ("What's happening in the video?", "Can you describe the video?",
                           "What goes on in this clip?", "Give me a summary of the clip.",
                           "What did the shape do?", "Tell me about this video."),
    },
    "zh": {
        "describe": ("这是什么图形？", "图上画了什么？", "这张照片里有什么东西？", "给我讲讲这张图。",
                     "请描述图中的内容。", "这幅图画的是什么？"),
        "ocr": ("卡片上写的是什么？", "图上是什么字？", "帮我读一下图中的文字。", "请读出照片中的文字。",
                "这上面写了什么？", "识别一下文字。"),
        "count": ("图片中一共有几个图形？", "帮我数数有几个图形。", "有多少个形状？", "图里有几个东西？",
                  "一共几个？", "数一数照片里的物体。"),
        "color": ("{shape}是哪种颜色？", "图片中{shape}的颜色是？", "请告诉我{shape}是什么颜色。",
                  "那个{shape}是什么颜色？", "{shape}的颜色是什么？", "照片里{shape}是啥颜色？"),
        "position_left": ("最左侧是什么？", "左边那个是什么图形？", "在最左边的是哪个？", "图的左边是什么形状？",
                          "最左面是什么？", "靠最左边的图形是什么？"),
        "position_right": ("最右侧是什么？", "右边那个是什么图形？", "在最右边的是哪个？", "图的右边是什么形状？",
                           "最右面是什么？", "靠最右边的图形是什么？"),
        "locate": ("找出图片里的物体并给出边界框。", "每个形状在什么位置？", "把所有物体框出来。",
                   "检测照片中的每个图形。", "定位所有形状。", "给出图中所有物体的边界框。"),
        "locate_one": ("{object}在什么地方？", "帮我找到{object}。", "请给出{object}的位置。",
                       "图片里的{object}在哪里？", "找一下{object}的边界框。", "{object}位于哪里？"),
        "describe_video": ("这个视频在讲什么？", "视频里有什么动静？", "帮我描述一下这段视频。", "片段中发生了什么事？",
                           "图形在视频里做了什么？", "请概括这段视频。"),
    },
}

POOLS = ("preset", "train", "held_out")

# Words people put around a question, which the model must learn to read past: training wraps half
# of its `TRAIN` phrasings in them (`dressed`), so that what decides an answer is the question's
# content words and not its exact string. Written as greetings, thanks and asides, not from
# `HELD_OUT`; a dressed question that happens to be a held-out phrasing is never produced.
AROUND: dict[str, dict[str, tuple[str, ...]]] = {
    "en": {
        "before": ("Hi! ", "Hello, ", "Hey. ", "Quick question: ", "Look at this. ", "OK, ", "Question: ",
                   "I need some help. ", "Excuse me, ", "So, ", "One more thing: ", "Here is a picture. "),
        "after": (" Thanks!", " Thank you.", " Please.", " Answer briefly.", " Be brief.", " Thanks a lot.",
                  " Just the answer, please.", " Short answer.", " Cheers."),
    },
    "zh": {
        "before": ("你好，", "您好！", "请问：", "麻烦你，", "问一下，", "看看这个。", "嗨，", "我想知道：", "那么，",
                   "这是一张图。"),
        "after": ("谢谢！", "谢谢。", "简单回答。", "请简短回答。", "麻烦了。", "多谢。", "只要答案。"),
    },
}


def dressed(rng, lang: str, phrasing: str) -> str:
    """``phrasing`` as a person might type it around the question: with a greeting before or thanks
    after it, in lower case or without its final mark (English), or unchanged. Draws from ``rng``."""
    out = phrasing
    r = rng.random()
    if r < 0.35:
        out = AROUND[lang]["before"][int(rng.integers(len(AROUND[lang]["before"])))] + out
    elif r < 0.6:
        out = out + AROUND[lang]["after"][int(rng.integers(len(AROUND[lang]["after"])))]
    r = rng.random()
    if lang == "en" and r < 0.25:
        out = out.lower()
    elif r < 0.45 and out[-1] in "?.!？。！":
        out = out[:-1]
    return phrasing if any(out in held for held in HELD_OUT[lang].values()) else out


def phrasings(pool: str, lang: str, kind: str) -> tuple[str, ...]:
    """The phrasings of one question kind: the preset alone, the training ones, or the held-out ones."""
    if pool == "preset":
        return TRAIN[lang][kind][:1]
    if pool == "train":
        return TRAIN[lang][kind]
    if pool == "held_out":
        return HELD_OUT[lang][kind]
    raise ValueError(f"unknown phrasing pool {pool!r}; expected one of {POOLS}")
