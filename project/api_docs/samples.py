"""The messages docs/api.md sends besides the sample conversation's."""

from __future__ import annotations

from typing import Any

Messages = list[dict[str, Any]]


def _turns(*texts: str) -> Messages:
    """Alternating user and assistant messages, the user first."""
    roles = ("user", "assistant")
    return [{"role": roles[index % 2], "content": text} for index, text in enumerate(texts)]


def _call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    function = {"name": name, "arguments": arguments}
    return {"id": call_id, "type": "function", "function": function}


# The sample conversation goes on: a note to the hotel, with a tool round.
HOTEL_NOTE: Messages = [
    {"role": "user", "content": "Thanks! Could you tell the hotel I will now arrive around 2 pm?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            _call(
                "call_note_05",
                "send_hotel_note",
                '{"confirmation": "CR-55810", "note": "Arrival around 14:00 on 13 June"}',
            )
        ],
    },
    {"role": "tool", "tool_call_id": "call_note_05", "content": '{"status": "delivered"}'},
    {"role": "assistant", "content": "Done: Casa do Rio expects you around 2 pm on 13 June."},
]

REPAIR_SYSTEM = "You are the repair desk of Northwind Computers."
# Twelve long turns about a laptop repair: below a trigger of 30 messages, above 400 tokens.
REPAIR: Messages = _turns(
    "My laptop, a Northwind Book 14 bought in March, shuts down whenever the battery drops "
    "below 40 percent, even though the indicator still shows plenty of charge left.",
    "That pattern usually points to a worn battery cell or a miscalibrated gauge. Could you "
    "tell me the serial number printed under the laptop and the current BIOS version?",
    "The serial number is NB14-2291-7734 and the BIOS setup screen says version 1.08, dated "
    "the second of February. I have not updated anything since I bought it.",
    "Thank you. Version 1.12 fixed a gauge calibration fault on this model, so please "
    "install it first from the support site, with the charger plugged in the whole time.",
    "I installed version 1.12 last night and let the battery run down this morning. It "
    "still switched off at 38 percent, without any warning message on the screen.",
    "Then the battery itself is the likely cause. It is covered by the two-year warranty, "
    "so we can replace it free of charge at the repair centre or send a technician to you.",
    "A technician would be much better, because I work from home and cannot be without the "
    "laptop for more than a day. Thursday or Friday morning would suit me best.",
    "I have booked a technician for Thursday, 9 to 11 am, under repair order RO-55102. "
    "Please keep the charger nearby and back up your files before the visit.",
    "Thursday works. Will the technician also check the hinge on the left side? It has "
    "started to creak when I open the lid, and the gap near the screen seems wider.",
    "Yes, I added a hinge inspection to order RO-55102. If the hinge needs a new part, the "
    "technician will order it and a second visit will be booked at no extra cost.",
    "Perfect, thank you. One last thing: will replacing the battery erase anything on the "
    "disk, or change any of my settings, passwords or installed programs?",
    "No: the battery is swapped without touching the disk, so your files, settings and "
    "programs stay exactly as they are. You will get a confirmation e-mail today.",
)

# Two short turns, then a pasted log far over a trigger of 300 tokens on its own.
_LOG_LINES = "\n".join(
    f"2025-06-13 07:{minute:02d}:00 ERROR payment gateway timeout after 30 s, order #{4100 + n}"
    for n, minute in enumerate(range(0, 48, 2))
)
LOG: Messages = [
    *_turns(
        "Since this morning our checkout fails for some customers: they see a spinner for "
        "half a minute, then an error page, and no order is created in the shop.",
        "That sounds like the payment gateway timing out. Please paste the gateway log of "
        "the last hour, with the order numbers, so we can see which requests failed.",
    ),
    {"role": "user", "content": f"Here it is:\n{_LOG_LINES}"},
]

ONE_WORD_TURNS: Messages = _turns("Hi", "Hello", "Thanks", "Welcome")

# A new conversation's first messages, with AUTO_COMPACT on: they reach its trigger.
PORTO: Messages = _turns(
    "I am planning a week in Porto in September with my partner.",
    "Lovely. Do you have dates and a budget for the hotel in mind?",
    "From the 8th to the 15th, and about 150 euros a night.",
    "Noted: 8 to 15 September, around 150 euros a night. Any area you prefer?",
    "Ribeira, near the river, and a room with a view if possible.",
    "I will look for river-view rooms in Ribeira within that budget.",
    "Also, we need to be at the airport by 6 am on the 15th.",
)
PORTO_MORE: Messages = _turns(
    "Book the cheapest river-view room you find, please.",
    "Booked: Casa Ribeira, river view, 142 euros a night, confirmation PR-2208.",
)
